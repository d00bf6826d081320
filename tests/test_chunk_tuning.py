"""chunk_size="auto": the chunked mixers' chunk size measured on the shapes they run,
recorded, and given back to a resumed run instead of measured again."""
import time

import pytest
import torch

import zoo
from tasks.engine.losses import lm_loss
from tasks.engine.train import TrainConfig, train
from zoo.mixers.base import check_chunk_size
from zoo.ops import chunk_tuning
from zoo.ops.chunk_tuning import candidates, measured_chunk_size

CHUNKED = ["gated_deltanet", "gla", "mamba", "mamba2", "retnet", "rwkv6"]


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    monkeypatch.setattr(chunk_tuning, "choices", {})


def test_candidates_stop_at_the_first_size_that_holds_the_sequence():
    assert candidates(8) == (16,) and candidates(16) == (16,)
    assert candidates(64) == (16, 32, 64) and candidates(65) == (16, 32, 64, 128)
    assert candidates(10_000) == chunk_tuning.CHUNK_SIZES


def test_the_fastest_size_is_kept_per_shape_and_leaves_the_callers_graph_alone():
    calls = []

    def op(x, w, chunk_size):
        calls.append(chunk_size)
        time.sleep(0.004 if chunk_size != 32 else 0.0)
        return (x * w).cumsum(1), None

    x = torch.randn(2, 100, requires_grad=True)
    w = torch.randn(100)
    assert measured_chunk_size(op, (x, w), {}, length=100) == 32
    assert set(calls) == {16, 32, 64, 128} and x.grad is None  # timed on detached copies
    n = len(calls)
    assert measured_chunk_size(op, (x, w), {}, length=100) == 32 and len(calls) == n  # kept
    measured_chunk_size(op, (x[:1], w), {}, length=100)
    assert len(calls) > n  # another shape is measured on its own
    (key, (size, times)), *_ = chunk_tuning.choices.items()
    assert size == 32 and set(times) == {"16", "32", "64", "128"}


def test_a_short_sequence_is_not_timed():
    def op(x, chunk_size):
        raise AssertionError("timed")
    assert measured_chunk_size(op, (torch.zeros(1, 9),), {}, length=9) == 16


@pytest.mark.parametrize("name", CHUNKED)
def test_auto_computes_what_its_chosen_size_computes(name):
    torch.manual_seed(0)
    auto = zoo.build_mixer(name, 32, chunk_size="auto").double()
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    y = auto(x)
    size = auto.chunk_size_used
    assert size in candidates(40)
    fixed = zoo.build_mixer(name, 32, chunk_size=size).double()
    fixed.load_state_dict(auto.state_dict())
    assert torch.equal(fixed(x), y) and fixed.chunk_size_used == size


@pytest.mark.parametrize("bad", [0, -16, 1.5, "fast", True])
def test_a_bad_chunk_size_is_refused_naming_the_choices(bad):
    with pytest.raises(ValueError, match="chunk_size must be a positive integer or 'auto'"):
        check_chunk_size("gla", bad)
    with pytest.raises(ValueError, match="gla: chunk_size"):
        zoo.build_mixer("gla", 32, chunk_size=bad)


def _setup(steps):
    cfg = zoo.ModelConfig(vocab_size=40, d_model=32, n_layers=2, max_len=48, mixer="gla",
                          mixer_options={"n_heads": 2, "chunk_size": "auto"})
    tcfg = TrainConfig(steps=steps, batch_size=2, lr=3e-3, warmup_steps=1, eval_every=100,
                       checkpoint_every=2, device="cpu")

    def batch_fn(step):
        x = torch.randint(40, (2, 48), generator=torch.Generator().manual_seed(step))
        return x, torch.roll(x, -1, dims=1)
    return zoo.build_model(cfg, seed=0), tcfg, batch_fn


def test_records_carry_the_sizes_and_a_resumed_run_takes_them_instead_of_measuring(tmp_path, monkeypatch):
    ckpt = tmp_path / "checkpoint.pt"
    monkeypatch.setattr(chunk_tuning, "fastest", lambda fns, device: ("32", {k: 1.0 for k in fns}))
    model, tcfg, batch_fn = _setup(steps=4)
    train(model, tcfg, batch_fn, lm_loss, checkpoint=ckpt, progress=False)
    assert model.chunk_sizes() == {"0": 32, "1": 32}
    assert torch.load(ckpt, weights_only=False)["chunk_sizes"] == [32, 32]

    def refuse(*args, **kwargs):
        raise AssertionError("a resumed run measured again")
    monkeypatch.setattr(chunk_tuning, "choices", {})
    monkeypatch.setattr(chunk_tuning, "fastest", refuse)
    model, tcfg, batch_fn = _setup(steps=6)
    res = train(model, tcfg, batch_fn, lm_loss, checkpoint=ckpt, progress=False)
    assert res.resumed_from == 4 and res.steps == 6
    assert [b.mixer.chunk_size for b in model.blocks] == [32, 32] and model.chunk_sizes() == {"0": 32, "1": 32}


def test_the_chunk_size_table_times_every_candidate_in_a_child_process(capsys):
    from tasks.benchmarks.chunk_sizes import chunked_mixers, main

    assert chunked_mixers() == sorted(CHUNKED)
    rows = main(["--points", "40x32x2", "--mixers", "gla,retnet"])
    for name in ("gla", "retnet"):
        mine = [r for r in rows if r["mixer"] == name]
        assert [r["chunk_size"] for r in mine] == [16, 32, 64] and all(r["status"] == "ok" for r in mine)
        assert sum(r["fastest"] for r in mine) == 1 and all(r["ms"] > 0 for r in mine)
    assert {r["default_chunk_size"] for r in rows if r["mixer"] == "gla"} == {16}
    assert "-> " in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--mixers", "attention"])
