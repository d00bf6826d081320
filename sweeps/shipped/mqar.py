"""MQAR on Zoology's Figure-2 grid (Arora et al. 2023, HazyResearch/zoology
``iclr24_zoology_figure2``), every listed zoo mixer in the same MLP-free model.

The grid is ``tasks.mqar.task.ZOOLOGY_FIG2_GRID``, its one definition: (L, kv pairs) in
(64, 4), (128, 8), (256, 16), (512, 64); d_model 64..512; learning rates
logspace(-4, -2, 4); vocab 8,192; 100,000 training and 3,000 test examples with zeros
in the unused slots; 64 epochs at Zoology's batch sizes with a cosine decay to 0,
stopping early at 0.99; 2 layers for attention, 4 for the others. The figure keeps the
best learning rate per point. 448 runs: a cluster job.

    linbench run mqar --executor slurm --partition gpu --gpus 1 --time 120
"""
from sweeps import RunConfig
from tasks.mqar.task import ZOOLOGY_FIG2_GRID, grid_configs

MIXERS = {  # the grid's conventions (one attention head) plus the window of the control
    "attention": {}, "sliding_window": {"window": 16},
    "mamba": {}, "mamba2": {}, "rwkv6": {}, "retnet": {}, "grassmann": {},
}


def configs_for(mixer: str, options: dict, model: dict | None = None) -> list:
    """This grid's runs of ``mixer`` (``linbench vet --budget gpu`` builds its mixer's with it)."""
    return grid_configs(ZOOLOGY_FIG2_GRID, mixer, options, model_overrides=model)


configs = [RunConfig("mqar", cfg, label=mixer)
           for mixer, options in MIXERS.items() for cfg in configs_for(mixer, options)]
