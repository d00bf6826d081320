"""Length extrapolation on a CPU: every mixer trained on Wikitext-2 at L = 128, then read
on validation contexts of 1, 2, 4 and 8 times that, perplexity by position.

The ``cpu-2L`` recipe of ``wikitext2_cpu`` (2 layers, d_model 128, post-LN, the same
WordPiece, budget and parameter matching), one seed, but no learned positions: a table
of 128 positions cannot be read at position 1,000. Attention and the window take rotary
positions on their whole head instead (Zoology's rule: the others see order by
themselves). Each trained model then reads contiguous validation sequences of 128 x f
tokens (f = 1, 2, 4, 8) through its step form, 128 tokens per prefill with its state
carried, and reports the perplexity of each 128-token bucket of positions
(``tasks.wikitext2.ppl_by_position``): a model that extrapolates keeps its perplexity
flat past position 128, one that does not rises there.

    linbench run extrapolation_cpu --parallel 1 --threads 1 --results-dir results/reference
"""
from sweeps import RunConfig, local_data_dir, matched_models
from tasks.wikitext2 import paper_model_config, preset_config

BUDGET = 800_000
EVAL = 65_536  # tokens scored per context length
FACTORS = (1, 2, 4, 8)
ROTARY = {"n_heads": 4, "rotary": 32}  # d_model 128, 4 heads: the whole head of 32 channels
PEERS = {"sliding_window": {**ROTARY, "window": 16}, "mamba": {}, "mamba2": {}, "rwkv6": {},
         "retnet": {"n_heads": 4}, "grassmann": {"impl": "factored"}, "gated_deltanet": {"n_heads": 4},
         "gla": {"n_heads": 4}}

base = paper_model_config("attention", "cpu-2L").replace(positions="none", mixer_options=ROTARY)
models = matched_models(base, {"attention": ("attention", ROTARY), **{m: (m, o) for m, o in PEERS.items()}},
                        knob="auto")
configs = []
for label, model in models.items():
    cfg = preset_config("cpu-2L", model.mixer, model=model, data_dir=local_data_dir(), tokenizer="wordpiece",
                        wordpiece_vocab=8192, budget_tokens=BUDGET, eval_every_tokens=BUDGET // 8, eval_tokens=EVAL,
                        extrapolate=FACTORS)
    configs.append(RunConfig("wikitext2", cfg.replace(train=cfg.train.replace(device="cpu")), label=label))
