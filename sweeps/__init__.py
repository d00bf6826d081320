"""Sweeps: lists of typed run configs, run locally or on Slurm through submitit, with
one record per finished run (see ``linbench --help``)."""
from .core import (RunConfig, Sweep, SweepError, load_sweep, local_data_dir, make_run_id, matched_models, product,
                   validate)
from .launch import RunJob, execute, launch, plan
