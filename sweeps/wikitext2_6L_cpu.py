"""The paper's 6-layer block (its Table 1 setting) for 2 full epochs of Wikitext-2, on a CPU.

``paper-6L``: 6 layers, d_model 256, d_ff 1024, 4 heads, L = 128, batch 32, post-LN,
learned positions, tied embeddings, dropout 0.1, AdamW 1e-3 with warm-up and cosine
decay over the 2 epochs. Ids are the local WordPiece of 8,192 pieces (the paper's 30,522
bert-base-uncased ids need the hub). The peers are resized (``auto``: d_model, else d_ff)
to the TransformerLM's parameter count without embeddings, within 2%: the Grassmann mixer
as the paper's 6-layer model has it (offsets 1, 2, 4, 8, 12, 16 in every layer, the
gated blend, the exact ``factored`` implementation), a 16-token sliding window (the
Grassmann mixer's reach, with attention inside it) and Mamba-2. Attention and Grassmann
run 2 seeds, so their gap gets an interval. The whole validation split is scored four
times an epoch; each record carries its curve and the training FLOPs per token.

    linbench run wikitext2_6L_cpu --parallel 2 --results-dir results/reference
    linbench plot wikitext2_6L_cpu --results-dir results/reference
    linbench report wikitext2_6L_cpu --results-dir results/reference
"""
from sweeps import RunConfig, local_data_dir, matched_models
from tasks.wikitext2 import paper_model_config, preset_config

EPOCHS = 2
EVAL_EVERY = 620_000  # tokens: about a quarter of the 2.47M-piece training split
SEEDS = {"attention": (0, 1), "grassmann": (0, 1), "sliding_window": (0,), "mamba2": (0,)}
PEERS = {"grassmann": {"impl": "factored"}, "sliding_window": {"n_heads": 4, "window": 16}, "mamba2": {}}

base = paper_model_config("attention", "paper-6L")
models = matched_models(base, {"attention": ("attention", base.mixer_options),
                               **{m: (m, o) for m, o in PEERS.items()}}, knob="auto")
# Seed 0 of every mixer first: a sitting that stops early still holds one full comparison.
configs = []
for seed in (0, 1):
    for label, model in models.items():
        if seed in SEEDS[label]:
            cfg = preset_config("paper-6L", model.mixer, model=model, seed=seed, data_dir=local_data_dir(),
                                tokenizer="wordpiece", wordpiece_vocab=8192, epochs=EPOCHS,
                                eval_every_tokens=EVAL_EVERY)
            configs.append(RunConfig("wikitext2", cfg.replace(train=cfg.train.replace(device="cpu")),
                                     label=label))
