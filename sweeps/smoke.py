"""The local default: a few minutes on a 2-core CPU, every part of the pipeline.

MQAR at L=64 (4 key-value pairs) for attention, a sliding-window control, retnet and
mamba2 at two widths; long-context scaling of the same mixers at L = 256 .. 1024; and
a short Wikitext-2 run of a tiny TransformerLM and a parameter-matched mamba2 on the
word-level data of the local folder (``$LINBENCH_DATA`` or ``../shared/data``; the hub
when there is none).

    linbench run smoke --parallel 2 && linbench plot smoke && linbench report smoke
"""
import zoo
from sweeps import RunConfig, local_data_dir, matched_models
from tasks.mqar import MQARConfig
from tasks.scaling import ScalingConfig
from tasks.train import TrainConfig
from tasks.wikitext2 import paper_model_config, preset_config

CPU = dict(device="cpu")
MIXERS = {"attention": {"n_heads": 1}, "sliding_window": {"n_heads": 1, "window": 8},
          "retnet": {"n_heads": 1}, "mamba2": {}}

configs = []

# MQAR: Zoology's task at a size a laptop trains in seconds per run
for mixer, options in MIXERS.items():
    for d_model in (32, 64):
        model = zoo.ModelConfig(vocab_size=256, d_model=d_model, n_layers=2, mixer=mixer, mixer_options=options,
                                d_ff=0, max_len=64)
        train = TrainConfig(steps=200, batch_size=32, lr=3e-3, warmup_steps=20, eval_every=50, target=0.99, **CPU)
        cfg = MQARConfig(model=model, train=train, seq_len=64, num_kv_pairs=4, vocab_size=256,
                         num_train_examples=4000, num_test_examples=500)
        configs.append(RunConfig("mqar", cfg, label=mixer))

# Scaling: each mixer alone at d_model 64, L = 256 .. 1024, 4,096 tokens per batch
for mixer, options in MIXERS.items():
    cfg = ScalingConfig(mixer=mixer, mixer_options=options, d_model=64, min_len=256, max_len=1024, tokens=4096,
                        warmup=1, repeats=3, **CPU)
    configs.append(RunConfig("scaling", cfg, label=mixer, alone=True))

# Wikitext-2: the tiny preset, 50k training tokens, scored on 16k validation/test tokens
base = paper_model_config("attention", "tiny")
models = {"attention": base, **matched_models(base, {"mamba2": ("mamba2", {})}, knob="auto")}
for label, model in models.items():
    cfg = preset_config("tiny", model.mixer, model=model, data_dir=local_data_dir(), budget_tokens=50_000,
                        eval_tokens=16_384)
    configs.append(RunConfig("wikitext2", cfg.replace(train=cfg.train.replace(**CPU)), label=label))
