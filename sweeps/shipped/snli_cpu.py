"""SNLI offline on a CPU: the paper's two heads over a real pretrained frozen encoder, the
controls that say what their accuracies mean, and every zoo mixer from scratch.

Data (../shared/data/snli, no hub): training on dev (9,842 pairs), the checkpoint and the
learning rate chosen on the 998 gold-labelled pairs of the train sample, test (9,824)
read once at the chosen checkpoint; each record names the files it read.

Heads (the paper's Table 3 question): all-MiniLM-L6-v2 (``backbone="minilm"``, its own
WordPiece; features computed once per split and cached) under the 2-layer Transformer head
and the Grassmann-Plücker head at the paper's head sizes (d_model 256, d_ff 512, 4 heads,
d_proj 64, window 8, stride 8), whose trainable counts are within 2 % of each other
(tests/test_snli.py). MiniLM is not the paper's DistilBERT, and it saw SNLI/MultiNLI pairs
in its own training: the heads are compared with each other, not with Table 3's values.

Controls, each under the Transformer head unless it has none: ``majority class`` (three
learned logits: the training split's class frequencies), ``linear probe`` (one linear map
on the mean-pooled features: is a head needed?), ``hypothesis only`` (the premise left
out: SNLI's annotation artifact), ``random backbone`` (MiniLM's architecture with random
weights: what pretraining gives).

From scratch: every zoo mixer as a 2-layer LM at the ``cpu-2L`` width, matched to
attention's parameter count without embeddings (``auto``), on ``premise [SEP]
hypothesis`` with a word vocabulary of the SNLI splits, last-token pooling (every mixer is
causal), EPOCHS_SCRATCH passes over dev.

Every label runs the bracket LRS at seed 0; a label whose best rate lies at an edge of it
runs the next rates beyond that edge (EDGE_LRS, appended: the bracket's run ids stay);
SEEDS at each label's best rate follow once the bracket has run (BEST_LR, set here from
its records, as wikitext2_6L_cpu does).

    linbench run snli_cpu --parallel 2 --results-dir results/reference
    linbench report snli_cpu --results-dir results/reference
"""
from sweeps import RunConfig, local_data_dir, matched_models
from tasks.engine.train import TrainConfig
from tasks.snli.heads import HeadConfig
from tasks.snli.task import SNLIConfig
from tasks.wikitext2 import paper_model_config

LRS = (5e-4, 1e-3, 2e-3)
SEEDS = (0, 1, 2)
# label -> rates beyond the bracket's edge where its best seed-0 run lay (the Transformer
# head and the random backbone best at the lowest rate, the linear probe at the highest)
EDGE_LRS = {"Transformer head": (2.5e-4, 1.25e-4), "linear probe": (4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2, 1.28e-1),
            "random backbone": (2.5e-4, 1.25e-4)}
# label -> rate, once its bracket has run
BEST_LR: dict[str, float] = {"majority class": 5e-4, "linear probe": 3.2e-2, "hypothesis only": 1e-3,
                             "Grassmann-Plücker head": 1e-3, "Transformer head": 2.5e-4, "random backbone": 2.5e-4}
EPOCHS_HEADS = 10
EPOCHS_SCRATCH = 5

# label -> (head kind, the config's other fields)
HEADS = {"Transformer head": ("transformer", {}),
         "Grassmann-Plücker head": ("grassmann", {}),
         "majority class": ("prior", {}),
         "linear probe": ("linear", {}),
         "hypothesis only": ("transformer", {"inputs": "hypothesis"}),
         "random backbone": ("transformer", {"backbone": "minilm-random"})}
MIXERS = {"attention": {}, "sliding_window": {"n_heads": 4, "window": 16}, "grassmann": {"impl": "factored"},
          "mamba": {}, "mamba2": {}, "rwkv6": {}, "retnet": {"n_heads": 4}, "gated_deltanet": {"n_heads": 4},
          "gla": {"n_heads": 4}}

ATTENTION = paper_model_config("attention", "cpu-2L")
models = matched_models(ATTENTION, {m: (m, o) for m, o in MIXERS.items()}, knob="auto")


def head_config(label: str, seed: int, lr: float) -> RunConfig:
    kind, fields = HEADS[label]
    cfg = SNLIConfig(seed=seed, setting="distilbert", data_dir=local_data_dir(), tokenizer="minilm",
                     **{"backbone": "minilm", **fields}, head=HeadConfig(kind=kind), epochs=EPOCHS_HEADS,
                     train=TrainConfig(batch_size=32, lr=lr, warmup_steps=200, device="cpu"))
    return RunConfig("snli", cfg, label=label)


def scratch_config(label: str, seed: int, lr: float) -> RunConfig:
    cfg = SNLIConfig(seed=seed, setting="scratch", data_dir=local_data_dir(), tokenizer="word",
                     model=models[label], pool="last", epochs=EPOCHS_SCRATCH,
                     train=TrainConfig(batch_size=32, lr=lr, warmup_steps=200, device="cpu"))
    return RunConfig("snli", cfg, label=label)


def config(label: str, seed: int, lr: float) -> RunConfig:
    return (head_config if label in HEADS else scratch_config)(label, seed, lr)


# The heads and controls first (minutes each on cached features), then the scratch brackets.
configs = [config(label, 0, lr) for label in (*HEADS, *MIXERS) for lr in LRS]
configs += [config(label, 0, lr) for label, rates in EDGE_LRS.items() for lr in rates]
configs += [config(label, seed, BEST_LR[label]) for label in (*HEADS, *MIXERS) if label in BEST_LR
            for seed in SEEDS[1:]]
