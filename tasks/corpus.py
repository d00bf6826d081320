"""Language modelling on any corpus, with Wikitext-2's recipe, evaluation and records.

The corpus is a Hugging Face dataset by name (``hf:NAME[:CONFIG][@SPLIT]``, streamed) or
local .txt / .jsonl / .parquet files, tokenized once by a named tokenizer into cached,
memory-mapped token ids (tasks.engine.documents). Training, evaluation (validation perplexity,
test perplexity at the best validation weights) and the record are those of the
Wikitext-2 task (tasks.engine.lm), so the two compare field by field:

    python -m tasks corpus --set source=my_texts/ --set train.steps=100 --out record.json
    linbench run corpus_fineweb --executor slurm --gpus 8 --tasks-per-node 8 --nodes 2
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import zoo
from zoo.config import NOT_IN_ID, StrictConfig, check_bounds

from .engine.documents import check_source, load_corpus
from .engine.lm import fit_lm
from .engine.runs import refuse_non_causal
from .engine.train import TrainConfig


@dataclass
class CorpusConfig(StrictConfig):
    seed: int = 0
    source: str = ""  # hf:NAME[:CONFIG][@SPLIT] or a local file, folder or glob
    valid_source: str | None = None  # None: held out of ``source`` (``holdout``)
    test_source: str | None = None
    text_field: str = "text"  # the column of .jsonl / .parquet / hub rows
    holdout: float = 0.01  # share of source's documents each for validation and test, when held out
    tokenizer: str = "wordpiece"  # "wordpiece" (trained here), "hub:NAME" or the path of a tokenizer.json
    wordpiece_vocab: int = 8192
    tokenizer_docs: int = 100_000  # training documents a WordPiece is trained on
    max_train_tokens: int | None = None  # stop tokenizing the training source there (a streamed corpus)
    max_eval_tokens: int | None = 1_000_000  # of validation and of test
    cache_dir: str | None = field(default=None, metadata=NOT_IN_ID)  # the tokenized splits ($LINBENCH_CACHE)
    seq_len: int = 256
    budget_tokens: int | None = None  # training tokens; None: ``epochs`` passes over train
    epochs: float = 1.0
    eval_every_tokens: int | None = None  # None: once per epoch (and at the end)
    eval_tokens: int | None = None  # tokens of valid/test scored; None: all that were tokenized
    model: zoo.ModelConfig = field(default_factory=lambda: zoo.ModelConfig(
        vocab_size=8192, d_model=256, n_layers=6, d_ff=1024, max_len=256, positions="learned"))
    train: TrainConfig = field(default_factory=lambda: TrainConfig(batch_size=32, lr=1e-3, warmup_steps=500))

    def __post_init__(self):
        own = "CorpusConfig"
        if not self.source:
            raise ValueError(f"{own}: source is empty; give hf:NAME[:CONFIG][@SPLIT] or a local file, folder or glob")
        check_bounds(self, "seed", ge=0)
        check_bounds(self, "holdout", gt=0, lt=0.5)
        check_bounds(self, "wordpiece_vocab", "tokenizer_docs", "max_train_tokens", "max_eval_tokens", "seq_len",
                     "budget_tokens", "epochs", "eval_every_tokens", "eval_tokens", gt=0)
        if self.model.max_len < self.seq_len:
            raise ValueError(f"{own}: model.max_len={self.model.max_len} < seq_len={self.seq_len}")

    def planned_tokens(self) -> int | None:
        return self.budget_tokens

    def check_inputs(self) -> None:
        """The local files this run reads exist and hold ``text_field`` (one record read
        of each format), and a tokenizer given as a path is a file. ``linbench run`` calls
        this before it sends anything; it is no part of building the config, since
        ``status`` and ``report`` read a sweep whose data may have moved since."""
        own = "CorpusConfig"
        try:
            for name in ("source", "valid_source", "test_source"):
                if getattr(self, name):
                    check_source(getattr(self, name), self.text_field, name)
        except ValueError as e:
            raise ValueError(f"{own}: {e}") from None
        if self.tokenizer != "wordpiece" and not self.tokenizer.startswith("hub:") \
                and not Path(self.tokenizer).expanduser().is_file():
            raise ValueError(f"{own}: tokenizer={self.tokenizer!r} is not valid: 'wordpiece', 'hub:NAME' or the "
                             f"path of a tokenizer.json, and there is no file {Path(self.tokenizer).expanduser()}")


def run(cfg: CorpusConfig, workdir: Path | None = None, progress: bool = True) -> dict:
    corpus = load_corpus(cfg.source, cfg.valid_source, cfg.test_source, cfg.text_field, cfg.holdout,
                         cfg.tokenizer, cfg.wordpiece_vocab, cfg.tokenizer_docs, cfg.max_train_tokens,
                         cfg.max_eval_tokens, cfg.cache_dir)
    mcfg = cfg.model.replace(vocab_size=corpus["vocab_size"])
    model = zoo.build_model(mcfg, seed=cfg.seed)
    refuse_non_causal(model, "corpus")
    fit = fit_lm(model, corpus, cfg.seq_len, cfg.train, cfg.seed, cfg.budget_tokens, cfg.epochs,
                 cfg.eval_every_tokens, cfg.eval_tokens, workdir, progress, f"corpus {mcfg.mixer}")
    return {"task": "corpus", "setting": f"{mcfg.n_layers}L/{cfg.seq_len}", **fit.record,
            "data_source": corpus["data_source"], "tokenizer": corpus["tokenizer"],
            "vocab_size": corpus["vocab_size"]}
