"""Zoology's MQAR figure (Arora et al. 2023, Fig. 2) scaled to a 2-core CPU.

The grid is ``tasks.mqar.task.CPU_GRID``: Zoology's figure-2 grid (``ZOOLOGY_FIG2_GRID``: its
data law, a cosine to 0, stopping at 0.99 accuracy) with what a CPU affords changed:
(L, kv pairs) in (64, 4), (128, 8), (256, 16), its first three; d_model 32 and 64; three
learning rates, logspace(-3, -2, 3); 2 layers for every mixer; a vocabulary of 512; 30
warm-up steps; a step budget per L. The figure keeps the best learning rate per point
(Zoology's rule).

The mixers: attention (the proof that the budget suffices), the 16-token sliding window
(the local control), the Grassmann mixer (offsets up to 16: the prediction is that it
behaves like the window), mamba2, rwkv6, gated_deltanet, and a hybrid whose second layer
is attention (does one attention layer give the Grassmann mixer recall?). Zoology's rule
gives the Grassmann mixer no positions, as it does every mixer that sees order by itself;
the paper's LM adds learned ones, and its mixer's shared projection of the mean over its
offsets cannot tell which offset a partner came from. So a control, at L 64 only (where the
window recalls and the Grassmann mixer does not): the Grassmann mixer with learned positions.

Controls for the local mixers, at L 64 and 128: the protocol, not the mixer, could explain
their rows. In MQAR a query's value always lies an odd number of tokens back (keys on even
slots, values on odd), and of the offsets 1, 2, 4, 8, 12, 16 only 1 is odd, so two layers
can bind a key to its value and bring the pair to the query only for the nearest queries
(``zoo.causality.bound_pair_reach``). So: Zoology's own layer rule for local mixers (4
layers for the Grassmann mixer and the window, its figure-2 file), the Grassmann mixer with
odd offsets (1, 3, 5, 9, 13, 17: the same count, reach and state), and the Grassmann mixer
with an MLP (4 x d_model), whose nonlinearity can bind what its offsets only sum.

Seeds where one run decides a verdict (``SEEDED``): 2 more seeds (1 and 2) at the point's
best learning rate of seed 0, at the points where a neighbouring point disagrees or the margin
to the verdict's threshold is thin: Mamba-2 at d 32, L 64 (0.243 where L 128 and 256 solve);
Gated DeltaNet at both widths at L 64 and 256 (the ends its loss of recall is read between);
RWKV-6 at d 32, L 256; the window at L 64 (read against its reach); the Grassmann + attention
hybrid at d 64, L 256 (0.982 on seed 0 against the 0.99 its verdict asks). RWKV-6's d 64 points,
each 30-110 minutes a run here, are left at one seed: its verdict holds at d 32 alone.

    linbench run mqar_cpu --parallel 2 --results-dir results/reference
    linbench plot mqar_cpu --results-dir results/reference && linbench report mqar_cpu --results-dir results/reference
"""
from sweeps import RunConfig
from tasks.mqar.task import CPU_GRID, grid_configs

ATTENTION_LAYER = {"hybrid": {"mixer": "attention", "every": 2, "options": {"n_heads": 1}}}
MIXERS = {  # label: (mixer, options, model overrides)
    "attention": ("attention", {}, None),
    "sliding_window": ("sliding_window", {"window": 16}, None),
    "grassmann": ("grassmann", {"impl": "factored"}, None),
    "mamba2": ("mamba2", {}, None),
    "rwkv6": ("rwkv6", {}, None),
    "gated_deltanet": ("gated_deltanet", {}, None),
    "grassmann+attention": ("grassmann", {"impl": "factored"}, ATTENTION_LAYER),
    "grassmann+positions": ("grassmann", {"impl": "factored"}, {"positions": "learned"}),
    "grassmann 4L": ("grassmann", {"impl": "factored"}, {"n_layers": 4}),
    "sliding_window 4L": ("sliding_window", {"window": 16}, {"n_layers": 4}),
    "grassmann odd offsets": ("grassmann", {"impl": "factored", "offsets": (1, 3, 5, 9, 13, 17)}, None),
    "grassmann+mlp": ("grassmann", {"impl": "factored"}, {"d_ff": None}),  # None: 4 x d_model
}
# Controls, not rows of the figure
LENGTHS = {"grassmann+positions": (64,), "grassmann 4L": (64, 128), "sliding_window 4L": (64, 128),
           "grassmann odd offsets": (64, 128), "grassmann+mlp": (64, 128)}

LR = CPU_GRID["lr"]
SEEDED = {  # (label, L, d_model): the point's best learning rate at seed 0
    ("mamba2", 64, 32): LR[2], ("gated_deltanet", 64, 32): LR[2], ("gated_deltanet", 256, 32): LR[2],
    ("gated_deltanet", 64, 64): LR[1], ("gated_deltanet", 256, 64): LR[1], ("rwkv6", 256, 32): LR[1],
    ("sliding_window", 64, 32): LR[2], ("sliding_window", 64, 64): LR[1], ("grassmann+attention", 256, 64): LR[1]}
EXTRA_SEEDS = (1, 2)


def configs_for(mixer: str, options: dict, model: dict | None = None) -> list:
    """This grid's runs of ``mixer`` (``linbench vet --budget cpu`` builds its mixer's with it)."""
    return grid_configs(CPU_GRID, mixer, options, model_overrides=model)


grid = [(label, cfg) for label, (mixer, options, model) in MIXERS.items()
        for cfg in configs_for(mixer, options, model)
        if cfg.seq_len in LENGTHS.get(label, (cfg.seq_len,))]
configs = [RunConfig("mqar", cfg, label=label) for label, cfg in grid]
configs += [RunConfig("mqar", cfg.replace(seed=seed), label=label) for seed in EXTRA_SEEDS for label, cfg in grid
            if SEEDED.get((label, cfg.seq_len, cfg.model.d_model)) == cfg.train.lr]
