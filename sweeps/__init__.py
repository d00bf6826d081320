"""Sweeps: lists of typed run configs, run locally or on Slurm through submitit, with
one record per finished run (see ``linbench --help``).

``spec`` is what a sweep is (run configs, ids, loading and validating a file), ``jobs``
what one run does as a job, ``launch`` and ``slurm`` where runs are sent, ``ledger`` what
is in flight, ``views`` what ``status`` and ``--dry-run`` print, and ``cli`` the
``linbench`` command. The sweep files the project ships live apart, in ``shipped/`` (not a
package: each is loaded by path)."""
from .jobs import RunJob, execute
from .launch import launch, plan
from .spec import (RunConfig, Sweep, SweepError, load_sweep, local_data_dir, make_run_id, matched_models,
                   shipped_sweeps, validate)
