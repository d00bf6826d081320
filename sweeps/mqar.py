"""MQAR on Zoology's Figure-2 grid (Arora et al. 2023, HazyResearch/zoology
``iclr24_zoology_figure2``), every zoo mixer in the same 2-layer, MLP-free model.

(L, kv pairs) in (64, 4), (128, 8), (256, 16), (512, 64); d_model 64..512; learning
rates logspace(-4, -2, 4); vocab 8,192; 100,000 training and 3,000 test examples with
zeros in the unused slots; 64 epochs at Zoology's batch sizes, stopping early at 0.99.
As in Zoology, only attention gets learned positions, and the figure keeps the best
learning rate per point. 448 runs: a cluster job.

    linbench run mqar --executor slurm --partition gpu --gpus 1 --time 120
"""
import itertools

import numpy as np

import zoo
from sweeps import RunConfig
from tasks.mqar import MQARConfig
from tasks.train import TrainConfig

VOCAB, TRAIN, TEST, EPOCHS = 8192, 100_000, 3_000, 64
SHAPES = [(64, 4, 512), (128, 8, 512), (256, 16, 256), (512, 64, 128)]  # (L, kv pairs, batch size)
D_MODELS = [64, 128, 256, 512]
LRS = [float(lr) for lr in np.logspace(-4, -2, 4)]
MIXERS = {  # Zoology's attention has one head; the others keep the zoo's defaults
    "attention": {"n_heads": 1},
    "sliding_window": {"n_heads": 1, "window": 16},
    "mamba": {}, "mamba2": {}, "rwkv6": {}, "retnet": {}, "grassmann": {},
}

configs = []
for (L, kv, batch), d_model, lr, (mixer, options) in itertools.product(SHAPES, D_MODELS, LRS, MIXERS.items()):
    steps = EPOCHS * TRAIN // batch
    model = zoo.ModelConfig(vocab_size=VOCAB, d_model=d_model, n_layers=2, mixer=mixer, mixer_options=options,
                            d_ff=0, max_len=L, positions="learned" if mixer == "attention" else "none")
    train = TrainConfig(steps=steps, batch_size=batch, lr=lr, warmup_steps=steps // 50,
                        eval_every=TRAIN // batch, target=0.99)
    cfg = MQARConfig(seed=0, model=model, train=train, seq_len=L, num_kv_pairs=kv, vocab_size=VOCAB,
                     num_train_examples=TRAIN, num_test_examples=TEST, random_non_queries=False)
    configs.append(RunConfig("mqar", cfg, label=mixer))
