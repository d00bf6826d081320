"""Language modelling on any corpus (tasks.corpus, tasks.engine.documents): local .txt, .jsonl
and .parquet files read as documents, validation and test held out by a fixed rule or read
from their own files, tokenized once into a cached memory map, and trained with Wikitext-2's
recipe into a record with Wikitext-2's fields."""
from __future__ import annotations

import json
import random

import pytest
import torch

import zoo
from tasks.corpus import CorpusConfig, run
from tasks.engine.documents import documents, load_corpus, split_documents
from tasks.engine.sources import DataUnavailable
from tasks.engine.train import TrainConfig

WORDS = "the a river city stone light north early music field green water small king old".split()


def _docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 30))) + "." for _ in range(n)]


@pytest.fixture
def corpus_dir(tmp_path):
    root = tmp_path / "texts"
    root.mkdir()
    docs = _docs(300)
    (root / "a.txt").write_text("\n".join(docs[:100]) + "\n\n")  # blank lines are no documents
    (root / "b.jsonl").write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs[100:200])))
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": docs[200:], "n": list(range(100))}), root / "c.parquet")
    return root, docs


def test_documents_of_every_format_in_order(corpus_dir):
    root, docs = corpus_dir
    assert list(documents(str(root))) == docs
    assert list(documents(str(root / "*.jsonl"))) == docs[100:200]


def test_a_missing_field_or_source_names_what_is_wrong(corpus_dir, tmp_path):
    root, _ = corpus_dir
    with pytest.raises(ValueError, match="no field 'body' \\(text_field\\); it has \\['id', 'text'\\]"):
        list(documents(str(root / "b.jsonl"), "body"))
    with pytest.raises(ValueError, match="no column 'body'"):
        list(documents(str(root / "c.parquet"), "body"))
    with pytest.raises(DataUnavailable, match="no .txt/.jsonl/.parquet file there"):
        list(documents(str(tmp_path / "nowhere")))
    with pytest.raises(ValueError, match="source is empty"):
        CorpusConfig()
    with pytest.raises(ValueError, match="holdout=0.7"):
        CorpusConfig(source="x", holdout=0.7)


def test_held_out_splits_partition_the_documents(corpus_dir):
    root, docs = corpus_dir
    parts = {s: list(split_documents(str(root), s, "text", holdout=0.1)) for s in ("train", "valid", "test")}
    assert sorted(sum(parts.values(), [])) == sorted(docs)
    assert parts["valid"] == docs[8::10] and parts["test"] == docs[9::10]


def test_tokenized_once_memory_mapped_and_capped(corpus_dir, tmp_path):
    root, _ = corpus_dir
    args = dict(source=str(root), valid_source=None, test_source=None, text_field="text", holdout=0.1,
                tokenizer="wordpiece", vocab_size=120, tokenizer_docs=1000, max_train_tokens=500,
                max_eval_tokens=None, cache_dir=str(tmp_path / "cache"))
    first = load_corpus(**args)
    assert len(first["train"]) == 500 and first["train"].dtype == torch.uint16
    assert int(first["train"].long().max()) < first["vocab_size"] <= 120
    files = sorted((tmp_path / "cache" / "corpus").glob("*.bin"))
    assert len(files) == 3
    stamps = [p.stat().st_mtime_ns for p in files]
    again = load_corpus(**args)  # read back, not tokenized again
    assert [p.stat().st_mtime_ns for p in files] == stamps and torch.equal(again["valid"], first["valid"])
    # the tokenizer as a file: the same ids
    tok_file = next((tmp_path / "cache").glob("wordpiece-*.json"))
    by_path = load_corpus(**{**args, "tokenizer": str(tok_file)})
    assert torch.equal(by_path["test"], first["test"])
    with pytest.raises(ValueError, match="tokenizer='nope.json' is not valid"):
        load_corpus(**{**args, "tokenizer": "nope.json"})


def test_a_run_from_local_files_has_the_wikitext2_record(corpus_dir, tmp_path):
    root, docs = corpus_dir
    (tmp_path / "valid.txt").write_text("\n".join(_docs(20, seed=1)))
    model = zoo.ModelConfig(vocab_size=2, d_model=32, n_layers=1, d_ff=64, max_len=32, mixer="mamba2")
    cfg = CorpusConfig(source=str(root), valid_source=str(tmp_path / "valid.txt"), wordpiece_vocab=150,
                       seq_len=32, budget_tokens=32 * 8 * 12, eval_every_tokens=32 * 8 * 4, model=model,
                       cache_dir=str(tmp_path / "cache"),
                       train=TrainConfig(batch_size=8, lr=3e-3, warmup_steps=2, device="cpu"))
    rec = run(cfg, tmp_path / "work", progress=False)
    assert rec["status"] == "ok" and rec["steps"] == 12 and rec["eval_steps"] == [4, 8, 12]
    assert rec["vocab_size"] <= 150 and "valid " + str(tmp_path / "valid.txt") in rec["data_source"]
    assert rec["best_val_ppl"] < rec["val_ppl_history"][0] and rec["test_ppl"] < rec["vocab_size"]
    assert (tmp_path / "work" / "weights.pt").is_file()
    shared = {"mixer", "layout", "params", "state_size", "backends", "tokens_seen", "epochs_seen",
              "val_ppl_history", "train_loss_history", "best_val_ppl", "test_ppl", "precision", "world_size",
              "train_flops_per_token", "tokenizer", "data_source", "setting"}
    assert shared <= set(rec)


def test_the_documented_command_line_builds_its_config_from_the_sets(corpus_dir, capsys):
    """`python -m tasks corpus --set source=... --set budget_tokens=...`: the corpus config has
    no valid default source, so the command line's values go in before it is validated."""
    from tasks.__main__ import main
    from tasks.engine.cli import config_from_sets

    cfg = config_from_sets(CorpusConfig, [f"source={corpus_dir}", "budget_tokens=2000"], seed=3)
    assert cfg.source == str(corpus_dir) and cfg.budget_tokens == 2000 and cfg.seed == 3
    with pytest.raises(SystemExit):
        main(["corpus", "--set", f"source={corpus_dir}", "--set", "budget_tokens=oops"])
    err = capsys.readouterr().err
    assert "budget_tokens='oops' must be an int" in err and "Traceback" not in err
