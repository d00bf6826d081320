"""The published readings of the Grassmann mixer, one option at a time against the
default, in the paper's 6-layer Wikitext-2 setting (3 seeds): which reading moves the
perplexity, and so which one can explain why the reproductions disagree.

Each variant changes exactly one thing of the default GrassmannLM (past pairing, mean
over offsets, the paper's blend, L2 normalisation with eps 1e-6, post-LN blocks):
eps 1e-8 (the reproductions'), no normalisation, a sum over offsets, a gated residual
instead of the blend, and pre-LN blocks (alphaXiv's block order). The
TransformerLM of the same preset is the reference line. The literal "future" pairing
is left out: it reads the tokens it must predict, and the task refuses to train it.

    linbench run grassmann_variants --executor slurm --partition gpu --gpus 1 --time 240
"""
from sweeps import RunConfig
from tasks.wikitext2 import paper_model_config, preset_config

PRESET, SEEDS = "paper-6L", (0, 1, 2)
DATA = dict(variant="raw", tokenizer="bert-base-uncased", data_dir=None)
default = paper_model_config("grassmann", PRESET)
VARIANTS = {
    "TransformerLM": paper_model_config("attention", PRESET),
    "grassmann (default)": default,
    "grassmann eps=1e-8": default.replace(mixer_options={**default.mixer_options, "eps": 1e-8}),
    "grassmann no normalize": default.replace(mixer_options={**default.mixer_options, "normalize": False}),
    "grassmann sum over offsets": default.replace(mixer_options={**default.mixer_options, "aggregate": "sum"}),
    "grassmann gated residual": default.replace(mixer_options={**default.mixer_options, "mixing": "gated_residual"}),
    "grassmann pre-LN block": default.replace(block="prenorm"),
}

configs = [RunConfig("wikitext2", preset_config(PRESET, model.mixer, model=model, seed=seed, **DATA), label=label)
           for label, model in VARIANTS.items() for seed in SEEDS]
