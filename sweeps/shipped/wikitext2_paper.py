"""Wikitext-2 in the paper's settings (arXiv 2512.19428, Tables 1-2), 3 seeds.

Two presets: 6 layers at L=128 (batch 32) and 12 layers at L=256 (batch 16), d_model
256, d_ff 1024, post-LN blocks, learned positions, 30 epochs over wikitext-2-raw in
bert-base-uncased WordPiece ids, from the Hugging Face hub (the paper's data). The
TransformerLM and the GrassmannLM are the paper's own models; mamba, mamba2, rwkv6,
retnet and a sliding-window control are resized (d_model, else d_ff) to the TransformerLM's
parameter count without embeddings (within 2%), the same backbone around each mixer.
The report puts the numbers beside the paper's and the public reproductions'.

    linbench run wikitext2_paper --executor slurm --partition gpu --gpus 1 --time 240
"""
from sweeps import RunConfig, matched_models
from tasks.wikitext2 import paper_model_config, preset_config

SEEDS = (0, 1, 2)
PEERS = ("mamba", "mamba2", "rwkv6", "retnet", "sliding_window")
DATA = dict(variant="raw", tokenizer="bert-base-uncased", data_dir=None)

ATTENTION = paper_model_config("attention", "paper-6L")  # the 6-layer models are matched to it


def config_for(label: str, model, seed: int, preset: str = "paper-6L") -> RunConfig:
    """One run of this recipe (``linbench vet --budget gpu`` builds its mixer's with it)."""
    return RunConfig("wikitext2", preset_config(preset, model.mixer, model=model, seed=seed, **DATA), label=label)


configs = []
for preset in ("paper-6L", "paper-12L"):
    base = paper_model_config("attention", preset)
    models = {"TransformerLM": base, "GrassmannLM": paper_model_config("grassmann", preset)}
    peers = {m: (m, paper_model_config(m, preset).mixer_options) for m in PEERS}
    models.update(matched_models(base, peers, knob="auto"))
    configs += [config_for(label, model, seed, preset) for label, model in models.items() for seed in SEEDS]
