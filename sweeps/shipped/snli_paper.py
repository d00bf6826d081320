"""SNLI in the paper's setting (arXiv 2512.19428, Table 3), 3 seeds.

Frozen ``distilbert-base-uncased`` token features under a trained classification head:
a 2-layer Transformer head against the Grassmann-Plücker head (d_proj 64, window 8
with stride 8, d_model 256, 2 mixing layers, 4 heads, d_ff 512, dropout 0.1), data
and weights from the Hugging Face hub. The report puts the accuracies beside Table 3.

    linbench run snli_paper --executor slurm --partition gpu --gpus 1 --time 240
"""
from sweeps import RunConfig
from tasks.snli.task import SNLIConfig
from tasks.snli.heads import HeadConfig

SEEDS = (0, 1, 2)
HEADS = {"Transformer head": "transformer", "Grassmann-Plücker head": "grassmann"}

configs = [
    RunConfig("snli", SNLIConfig(seed=seed, setting="distilbert", tokenizer="bert-base-uncased", data_dir=None,
                                 backbone="distilbert-base-uncased", head=HeadConfig(kind=kind)), label=label)
    for label, kind in HEADS.items() for seed in SEEDS
]
