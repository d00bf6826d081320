"""The local default (``make demo``): every part of the pipeline in about 10 minutes
of a 2-core CPU, on real data.

- MQAR at L=64 with 4 key-value pairs (the local recipe of ``MQARConfig``: vocab 128,
  batch 64, lr 3e-3, stop at 0.99; 800 steps instead of its 1,500) for attention, a
  sliding-window control (2 layers of 8 tokens: blind to queries more than 16 tokens
  after their key), mamba2, retnet and the Grassmann mixer, d_model 64, one seed;
- long-context scaling of every mixer alone, d_model 64, L = 256 .. 2048 at 4,096
  tokens per batch (forward and forward+backward);
- the decode benchmark of the MQAR mixers, d_model 64, after contexts of 0, 512 and
  2,048 tokens (16 timed steps each);
- a short Wikitext-2 run (the ``tiny`` preset, 300k training tokens of the word-level
  data of ``$LINBENCH_DATA`` or ``../shared/data``, else the hub, in a WordPiece of 8,192
  pieces trained on its training split) of a TransformerLM and a parameter-matched
  mamba2 and Grassmann LM.

The Grassmann mixer runs its exact ``factored`` form here: ``compiled`` would spend
most of a smoke run compiling.

    linbench run smoke --parallel 2 && linbench plot smoke && linbench report smoke
"""
import zoo
from sweeps import RunConfig, local_data_dir, matched_models
from tasks.mqar.task import MQARConfig
from tasks.benchmarks.decode import DecodeConfig
from tasks.benchmarks.scaling import ScalingConfig
from tasks.wikitext2 import paper_model_config, preset_config

CPU = dict(device="cpu")
GRASSMANN = {"impl": "factored"}
MQAR = {"attention": {"n_heads": 1}, "sliding_window": {"n_heads": 1, "window": 8}, "mamba2": {},
        "retnet": {"n_heads": 1}, "grassmann": GRASSMANN}
# every registered mixer is timed, one of your own included: the demo is exploratory
SCALING = {mixer: MQAR.get(mixer, {}) for mixer in zoo.MIXERS}

configs = []

# MQAR: as Zoology, only attention gets positions; the others must find order themselves
base = MQARConfig()
for mixer, options in MQAR.items():
    model = base.model.replace(mixer=mixer, mixer_options=options,
                               positions="learned" if mixer == "attention" else "none")
    cfg = base.replace(model=model, train=base.train.replace(steps=800, **CPU))
    configs.append(RunConfig("mqar", cfg, label=mixer))

# Scaling: one mixer at a time on the whole machine, so timings do not share cores
for mixer, options in SCALING.items():
    cfg = ScalingConfig(mixer=mixer, mixer_options=options, d_model=64, min_len=256, max_len=2048, tokens=4096,
                        warmup=1, repeats=3, **CPU)
    configs.append(RunConfig("scaling", cfg, label=mixer, exclusive=True))

# Decode: time per generated token against the context, the same mixers at d_model 64
for mixer, options in MQAR.items():
    cfg = DecodeConfig(mixer=mixer, mixer_options=options, d_model=64, contexts=(0, 512, 2048), new_tokens=16,
                       warmup=2, bandwidth_mb=128, **CPU)
    configs.append(RunConfig("decode", cfg, label=mixer, exclusive=True))

# Wikitext-2: the tiny preset on a WordPiece of 8,192 pieces (a 33k-word softmax would
# take most of the budget), 300k training tokens, scored on 16k validation/test tokens
lm = paper_model_config("attention", "tiny")
models = {"attention": lm, **matched_models(lm, {"mamba2": ("mamba2", {}), "grassmann": ("grassmann", GRASSMANN)},
                                            knob="auto")}
for label, model in models.items():
    cfg = preset_config("tiny", model.mixer, model=model, data_dir=local_data_dir(), tokenizer="wordpiece",
                        wordpiece_vocab=8192, budget_tokens=300_000, eval_every_tokens=75_000, eval_tokens=16_384)
    configs.append(RunConfig("wikitext2", cfg.replace(train=cfg.train.replace(**CPU)), label=label))
