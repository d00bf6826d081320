"""Wikitext-2 language modelling, in the paper's presets and as short local runs.

The paper (arXiv 2512.19428, Tables 1-2) trains d_model 256, d_ff 1024, 4 heads,
learned positions, 30 epochs: 6 layers at L=128 with batch 32, and 12 layers at L=256
with batch 16, on ``bert-base-uncased`` WordPiece ids of ``wikitext-2-raw-v1``. A run
here is that preset with a budget in tokens, so a laptop runs a short prefix of the
very recipe a cluster runs in full:

    python -m tasks.wikitext2 --data-dir ../shared/data --mixer attention --budget-tokens 200000
    python -m tasks.wikitext2 --preset paper-6L --mixer grassmann --variant raw --tokenizer bert-base-uncased

The data defaults to the standard word-level recipe (``wikitext-2-v1``, 33,278 words),
which a local folder holds whole; the paper's ids are ``--variant raw --tokenizer
bert-base-uncased`` (hub only), and ``--tokenizer wordpiece`` is their offline stand-in.
The training stream is cut into contiguous chunks of L tokens, visited in a fresh
seeded order each epoch; evaluation scores the contiguous chunks of a split, and the
test perplexity is measured with the weights of the best validation evaluation.
"""
from __future__ import annotations

import argparse
import sys
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

import zoo
from zoo.config import NOT_IN_ID, WHEN_SET, StrictConfig, check_bounds, check_choice


from .engine.cli import add_run_arguments, mixer_name, run_from_cli
from .engine.sources import LOCAL_OR_HUB
from .engine.wikitext import load_wikitext2, unigram_perplexity, wikitext2_text
from .engine.lm import Chunks, fit_lm
from .engine.paper import PAPER, PRESETS, paper_model_config
from .engine.runs import load_weights, refuse_non_causal
from .engine.train import TrainConfig
from .published import published_rows

@dataclass
class WikiText2Config(StrictConfig):
    seed: int = 0
    preset: str = "paper-6L"  # a label for the record; the fields below hold its values
    variant: str = "tokens"  # "tokens" (wikitext-2-v1) or "raw" (wikitext-2-raw-v1, the paper's)
    tokenizer: str = "word"  # "word" (tokens only), "bert-base-uncased" (hub, the paper's), "wordpiece"
    wordpiece_vocab: int = 30522  # target size of a WordPiece trained here
    # None: the Hugging Face hub; else a folder laid out as ../shared/data
    data_dir: str | None = field(default=None, metadata=LOCAL_OR_HUB)
    cache_dir: str | None = field(default=None, metadata=NOT_IN_ID)  # tokenized splits and trained tokenizers ($LINBENCH_CACHE)
    seq_len: int = 128
    epochs: float = 30
    budget_tokens: int | None = None  # training tokens; None: `epochs` passes over train
    eval_every_tokens: int | None = None  # None: once per epoch (and at the end)
    eval_tokens: int | None = None  # tokens of valid/test scored; None: the whole split
    # Length extrapolation: after training, validation perplexity by position on contexts of
    # these multiples of seq_len (e.g. (1, 2, 4, 8)), read by the step form in pieces of
    # seq_len; () none. Needs a model without learned positions.
    extrapolate: tuple = field(default=(), metadata=WHEN_SET)
    model: zoo.ModelConfig = field(default_factory=paper_model_config)  # vocab_size: the tokenizer's
    train: TrainConfig = field(default_factory=lambda: TrainConfig(batch_size=32, lr=1e-3, warmup_steps=500))

    def __post_init__(self):
        check_choice("WikiText2Config", "variant", self.variant, ("tokens", "raw"))
        check_choice("WikiText2Config", "tokenizer", self.tokenizer, ("word", "wordpiece", "bert-base-uncased"))
        if self.tokenizer == "word" and self.variant != "tokens":
            raise ValueError("WikiText2Config: tokenizer='word' needs variant='tokens'")
        if self.model.max_len < self.seq_len:
            raise ValueError(f"WikiText2Config: model.max_len={self.model.max_len} < seq_len={self.seq_len}")
        if self.extrapolate and (self.model.positions == "learned" or any(
                not isinstance(f, int) or isinstance(f, bool) or f < 1 for f in self.extrapolate)):
            raise ValueError(f"WikiText2Config: extrapolate={self.extrapolate!r} needs whole multiples >= 1 of "
                             f"seq_len and a model without learned positions (model.positions="
                             f"{self.model.positions!r}: 'none', with rotary attention where it needs order)")
        check_bounds(self, "seed", ge=0)
        check_bounds(self, "wordpiece_vocab", "seq_len", "epochs", "budget_tokens", "eval_every_tokens", "eval_tokens",
                     gt=0)  # None (unset optional fields) passes

    def planned_tokens(self) -> int | None:
        """The training tokens (``linbench status`` scales by them); None when set in epochs,
        whose tokens only the tokenized corpus knows."""
        return self.budget_tokens


def preset_config(preset: str = "paper-6L", mixer: str = "attention", **fields) -> WikiText2Config:
    """The task config of a preset for ``mixer``; ``fields`` override the rest."""
    p = {**PAPER, **PRESETS[preset]}
    # AdamW at lr 1e-3 (kanenorman/grassmann's default), 500 warm-up steps, cosine decay:
    # optimiser settings are ours; the paper does not give its own.
    base = WikiText2Config(preset=preset, seq_len=p["seq_len"], epochs=p["epochs"],
                           model=paper_model_config(mixer, preset),
                           train=TrainConfig(batch_size=p["batch_size"], lr=1e-3, warmup_steps=500))
    return base.replace(**fields)


@torch.no_grad()
def position_losses(model: zoo.LM, ids: torch.Tensor, piece: int) -> torch.Tensor:
    """Next-token losses (B, T - 1) of sequences ids (B, T), the model reading them through
    its step form, ``piece`` tokens per prefill with each layer's state carried: a context
    longer than any forward the model was trained on, in the memory of one piece."""
    state = model.init_state(ids.shape[0], ids.device, next(model.parameters()).dtype)
    losses = []
    for start in range(0, ids.shape[1] - 1, piece):
        x, y = ids[:, start:start + piece], ids[:, start + 1:start + piece + 1]
        logits, state = model.prefill(x[:, :y.shape[1]], state)  # (B, l, V)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 logits: the loss in fp32
        losses.append(F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape))
    return torch.cat(losses, 1)


def ppl_by_position(model: zoo.LM, ids: torch.Tensor, seq_len: int, factors, max_tokens: int | None,
                    batch_size: int) -> dict[str, list[float]]:
    """For each factor f: perplexity per position bucket [k L, (k+1) L), k < f, over
    contiguous sequences of f L + 1 tokens of ``ids`` (at most ``max_tokens`` scored per f)."""
    model.eval()
    device = next(model.parameters()).device
    out = {}
    for f in factors:
        chunks = Chunks(ids, f * seq_len, max_tokens)
        total = torch.zeros(f * seq_len, dtype=torch.float64)
        for start in range(0, chunks.n, batch_size):
            x, y = chunks.get(torch.arange(start, min(start + batch_size, chunks.n)))
            seq = torch.cat([x, y[:, -1:]], 1).to(device)  # (B, f L + 1)
            total += position_losses(model, seq, seq_len).sum(0).double().cpu()
        buckets = total.view(f, seq_len).sum(1) / (chunks.n * seq_len)  # mean loss per bucket
        out[str(f)] = [math.exp(v) for v in buckets.tolist()]
    return out


def run(cfg: WikiText2Config, workdir: Path | None = None, progress: bool = True) -> dict:
    corpus = load_wikitext2(cfg.variant, cfg.tokenizer, cfg.data_dir, cfg.cache_dir, cfg.wordpiece_vocab)
    mcfg = cfg.model.replace(vocab_size=corpus["vocab_size"])
    model = zoo.build_model(mcfg, seed=cfg.seed)
    refuse_non_causal(model, "wikitext2")
    fit = fit_lm(model, corpus, cfg.seq_len, cfg.train, cfg.seed, cfg.budget_tokens, cfg.epochs,
                 cfg.eval_every_tokens, cfg.eval_tokens, workdir, progress, f"wikitext2 {mcfg.mixer}")
    L, B = cfg.seq_len, cfg.train.batch_size
    extrapolation = {}
    if fit.result.best_state is not None and cfg.extrapolate:  # with the best weights fit_lm loaded
        extrapolation = {"ppl_by_position": ppl_by_position(model, corpus["valid"], L, cfg.extrapolate,
                                                            cfg.eval_tokens, B)}
    scored = fit.record["val_tokens_scored"]  # the unigram bar is measured on the same validation tokens
    return {
        "task": "wikitext2", "preset": cfg.preset,
        "setting": f"{mcfg.n_layers}L/{L}",  # as the published rows name theirs: layers/context
        **fit.record,
        "variant": cfg.variant, "data_source": corpus["data_source"], "tokenizer": corpus["tokenizer"],
        "vocab_size": corpus["vocab_size"],
        "unigram_val_ppl": unigram_perplexity(corpus["train"], corpus["valid"][: scored + 1][1:],
                                              corpus["vocab_size"]),
        **extrapolation,
    }


def sample(cfg: WikiText2Config, weights: Path, prompt: str, new_tokens: int = 50, temperature: float = 0.0,
           top_k: int | None = None, seed: int | None = None) -> str:
    """Text the model a run left (``weights``) writes after ``prompt``: the run's own
    tokenizer, the model's step form (zoo.generate), the new tokens decoded."""
    _, _, tok = wikitext2_text(cfg.variant, cfg.tokenizer, cfg.data_dir, cfg.cache_dir, cfg.wordpiece_vocab)
    model = load_weights(weights)
    ids = tok.encode_batch([prompt])[0]
    if getattr(tok, "eos", None):  # the word tokenizer ends each line with <eos>: the prompt goes on
        ids = ids[:-1]
    if not ids:
        raise ValueError(f"wikitext2: the prompt {prompt!r} has no tokens")
    if model.pos is not None and len(ids) + new_tokens > model.cfg.max_len:
        raise ValueError(f"wikitext2: {len(ids)} prompt tokens + {new_tokens} new ones exceed the "
                         f"{model.cfg.max_len} learned positions this model has; ask for fewer")
    out = zoo.generate(model, torch.tensor([ids]), new_tokens, temperature, top_k, seed)
    return tok.decode(out[0, len(ids):].tolist())


PAPER_NAMES = {"attention": "TransformerLM", "grassmann": "GrassmannLM"}


def beside_published(record: dict) -> str:
    """Our numbers and the published ones of the same setting, as a small table."""
    ours = (f"{'ours':<34} {PAPER_NAMES.get(record['mixer'], record['mixer']):<14} "
            f"{record['params'] / 1e6:>6.2f}M  best val {record['best_val_ppl']:.1f}  "
            f"test {record['test_ppl']:.1f}" if record["best_val_ppl"] else f"ours: {record['status']}, no eval")
    lines = [f"wikitext2 {record['preset']} ({record['setting']}), {record['mixer']}: "
             f"{record['tokens_seen']:,} tokens seen ({record['epochs_seen']:.3f} epochs), "
             f"{record['wall_time']:.0f} s on {record['device']}",
             f"data {record['data_source']}", f"tokenizer {record['tokenizer']}, vocab {record['vocab_size']:,}",
             f"unigram val ppl (train counts) {record['unigram_val_ppl']:.1f}; "
             f"val/test scored on {record['val_tokens_scored']:,}/{record['test_tokens_scored']:,} tokens", ours]
    rows = published_rows("wikitext2", record["setting"])
    if not rows:
        lines.append(f"(no published numbers for {record['setting']}; the paper's are 6L/128 and 12L/256)")
    for r in rows:
        params = f"{int(r['params']) / 1e6:.2f}M" if r["params"] else "?"
        lines.append(f"{r['source']:<34} {r['model']:<14} {params:>7}  "
                     f"{r['metric']} {r['split']} {r['value']}  {r['note']}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="paper-6L", choices=sorted(PRESETS))
    ap.add_argument("--mixer", default="attention", type=mixer_name, help="a registered mixer or an import path (module:Class)")
    ap.add_argument("--variant", default="tokens", choices=["tokens", "raw"])
    ap.add_argument("--tokenizer", default="word", choices=["word", "wordpiece", "bert-base-uncased"])
    ap.add_argument("--data-dir", default=None, help="local folder laid out as ../shared/data (default: the hub)")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--budget-tokens", type=int, default=None, help="default: the preset's 30 epochs")
    ap.add_argument("--eval-tokens", type=int, default=None, help="default: whole valid/test splits")
    ap.add_argument("--eval-every-tokens", type=int, default=None)
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    cfg = preset_config(args.preset, args.mixer, variant=args.variant, tokenizer=args.tokenizer,
                        data_dir=args.data_dir, cache_dir=args.cache_dir, budget_tokens=args.budget_tokens,
                        eval_tokens=args.eval_tokens, eval_every_tokens=args.eval_every_tokens, seed=args.seed)
    return run_from_cli(cfg, args, run, beside_published)


if __name__ == "__main__":
    sys.argv[0] = "python -m tasks.wikitext2"  # the usage line names the command, not the file
    main()
