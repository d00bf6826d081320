"""The paper's model presets (its 6- and 12-layer TransformerLM and GrassmannLM block,
and two CPU-sized ones), shared by its two tasks: Wikitext-2 and SNLI's scratch setting."""
from __future__ import annotations

import zoo
from zoo.config import check_choice

# Presets as data. "tiny" and "cpu-2L" are not the paper's: the paper's block at a
# width a 2-core CPU trains in minutes ("tiny", the smoke run) or in an hour for a
# seeded comparison of every mixer ("cpu-2L", sweeps/shipped/wikitext2_cpu.py).
PRESETS = {
    "paper-6L": dict(n_layers=6, seq_len=128, batch_size=32),
    "paper-12L": dict(n_layers=12, seq_len=256, batch_size=16),
    "tiny": dict(n_layers=2, seq_len=64, batch_size=16, d_model=64, d_ff=256),
    "cpu-2L": dict(n_layers=2, seq_len=128, batch_size=16, d_model=128, d_ff=512),
}
PAPER = dict(d_model=256, d_ff=1024, n_heads=4, epochs=30, dropout=0.1)
# The 12-layer GrassmannLM's one offset per layer (1,1,2,2,...,16,16); the 6-layer one
# uses all of (1,2,4,8,12,16) in every layer, the zoo mixer's default.
GRASSMANN_12L_OFFSETS = (1, 1, 2, 2, 4, 4, 8, 8, 12, 12, 16, 16)


def takes_heads(mixer: str) -> bool:
    """Whether the preset sets ``n_heads`` for ``mixer``: for every mixer that has that
    option (read from its own __init__), so a new mixer needs no entry here."""
    # an unknown name is refused by ModelConfig, with the valid ones
    return zoo.mixers.is_mixer(mixer) and "n_heads" in zoo.mixer_class(mixer).option_names


def paper_model_config(mixer: str = "attention", preset: str = "paper-6L", vocab_size: int = 30522,
                       **mixer_options) -> zoo.ModelConfig:
    """The preset's ModelConfig for ``mixer`` (the paper's post-LN block, tied embeddings,
    learned positions over exactly L). Parameter-matched peers come from
    ``zoo.match_params(paper_model_config("attention", preset), mixer)``."""
    check_choice("paper_model_config", "preset", preset, sorted(PRESETS))
    p = {**PAPER, **PRESETS[preset]}
    options = {"n_heads": p["n_heads"]} if takes_heads(mixer) else {}
    layers = ()
    if mixer == "grassmann" and p["n_layers"] == len(GRASSMANN_12L_OFFSETS):
        layers = tuple({"offsets": (o,)} for o in GRASSMANN_12L_OFFSETS)
    return zoo.ModelConfig(vocab_size=vocab_size, d_model=p["d_model"], n_layers=p["n_layers"],
                           d_ff=p["d_ff"], max_len=p["seq_len"], mixer=mixer,
                           mixer_options={**options, **mixer_options}, layer_options=layers,
                           block="postnorm", positions="learned", dropout=p["dropout"])
