"""MQAR: the generator's invariants (property tests), its power law, caching, the
grids, and two short trainings: attention learns it, a short sliding window cannot."""
import contextlib
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import zoo
from tasks import TASKS
from tasks.engine.losses import labelled_accuracy
from tasks.mqar.task import CPU_GRID, LOCAL_GRID, ZOOLOGY_FIG2_GRID, MQARConfig, grid_configs, load_split, run
from tasks.mqar.data import key_distances, mqar_examples


@st.composite
def mqar_shapes(draw):
    kv = draw(st.integers(1, 8))
    L = 2 * draw(st.integers(2 * kv, 40))  # even, 4 kv <= L
    V = draw(st.integers(L + 1, L + 200))
    return draw(st.integers(1, 16)), L, kv, V


@settings(max_examples=60, deadline=None)
@given(mqar_shapes(), st.integers(0, 2 ** 31 - 1), st.booleans(), st.sampled_from(["train", "test"]))
def test_generator_invariants(shape, seed, random_fill, split):
    n, L, kv, V = shape
    x, y = mqar_examples(n, L, kv, V, seed, split=split, random_non_queries=random_fill)
    assert x.shape == y.shape == (n, L) and x.dtype == y.dtype == torch.int64
    assert x.min() >= 0 and x.max() < V
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        keys, values = row_x[0:2 * kv:2], row_x[1:2 * kv:2]
        assert len(set(keys)) == kv and all(1 <= k < V // 2 for k in keys)
        assert len(set(values)) == kv and all(V // 2 <= v < V for v in values)
        answer = dict(zip(keys, values))
        queries = [t for t in range(L) if row_y[t] != -100]
        assert len(queries) == kv  # one labelled position per key ...
        assert all(t >= 2 * kv and t % 2 == 0 for t in queries)  # ... on an even slot after the pairs
        assert sorted(row_x[t] for t in queries) == sorted(keys)  # each key queried once
        assert all(row_y[t] == answer[row_x[t]] for t in queries)  # label = that key's value
        if not random_fill:
            rest = set(range(2 * kv, L)) - set(queries)
            assert all(row_x[t] == 0 for t in rest)


def test_same_seed_same_data_and_disjoint_splits():
    a = mqar_examples(200, 64, 4, 8192, seed=5)
    b = mqar_examples(200, 64, 4, 8192, seed=5)
    test = mqar_examples(200, 64, 4, 8192, seed=5, split="test")
    other = mqar_examples(200, 64, 4, 8192, seed=6)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[0], test[0]) and not torch.equal(a[0], other[0])
    rows = {tuple(r) for r in a[0].tolist()}
    assert not rows & {tuple(r) for r in test[0].tolist()}


@pytest.mark.parametrize("L, kv, V, message", [
    (63, 4, 8192, "even"),
    (64, 4, 64, "larger than seq_len"),
    (64, 17, 8192, "4 \\* num_kv_pairs <= seq_len"),
    (64, 0, 8192, "num_kv_pairs"),
])
def test_generator_checks(L, kv, V, message):
    with pytest.raises(ValueError, match=message):
        mqar_examples(4, L, kv, V, seed=0)


def test_query_gaps_follow_the_power_law():
    # The first key's query slot is the first draw of the sequential sampling, so its
    # law is exactly P(g) ~ (g + 1)^(a - 1) over the (L - 2 kv) / 2 slots.
    n, L, kv, a = 40_000, 64, 4, 0.01
    x, y = mqar_examples(n, L, kv, 8192, seed=1, random_non_queries=False)
    first_key = x[:, 0:1]
    pos = ((x == first_key) & (y != -100)).int().argmax(1)  # where key 0 is queried
    gaps = ((pos - 2 * kv) // 2).numpy()
    space = (L - 2 * kv) // 2
    p = np.arange(1, space + 1, dtype=float) ** (a - 1)
    p /= p.sum()
    freq = np.bincount(gaps, minlength=space) / n
    sigma = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(freq - p) < 5 * sigma + 1e-4)
    assert freq[0] > 0.2  # ~0.26: most queries come right after the pairs


def test_key_distances_measure_how_far_back_each_querys_key_sits():
    x = torch.tensor([[5, 9, 6, 8, 0, 0, 6, 1, 5, 2]])  # pairs (5, 9), (6, 8); 6 asked at 6, 5 at 8
    y = torch.full_like(x, -100)
    y[0, 6], y[0, 8] = 8, 9
    assert key_distances(x, y, 2).tolist() == [[6 - 2, 8 - 0]]
    x, y = mqar_examples(50, 64, 4, 512, seed=3, split="test")
    want = [[t - 2 * x[i, 0:8:2].tolist().index(int(x[i, t])) for t in torch.nonzero(y[i] != -100).flatten().tolist()]
            for i in range(50)]  # the same, one query at a time
    assert key_distances(x, y, 4).tolist() == want


def test_cache_round_trip_and_key(tmp_path):
    cfg = MQARConfig(cache_dir=str(tmp_path), num_train_examples=300, num_test_examples=50)
    x, y = load_split(cfg, "train")
    files = list(tmp_path.glob("mqar/mqar-train-*.pt"))  # under the cache root's mqar/
    assert len(files) == 1 and x.shape == (300, 64)
    again = load_split(cfg, "train")  # from the file now
    assert torch.equal(again[0], x) and torch.equal(again[1], y) and again[0].dtype == torch.int64
    assert torch.equal(x, mqar_examples(300, 64, 4, 128, cfg.seed)[0])  # the file holds the generator's data
    load_split(cfg.replace(power_a=0.5), "train")  # another generator config, another file
    assert len(list(tmp_path.glob("mqar/mqar-train-*.pt"))) == 2
    assert load_split(cfg, "test")[0].shape == (50, 64)
    # a file of an older layout under the same name is rebuilt, not misread
    torch.save({"inputs": x.int(), "labels": y.int(), "key": {}}, files[0])
    assert torch.equal(load_split(cfg, "train")[1], y) and "targets" in torch.load(files[0])


def test_config_validation():
    with pytest.raises(ValueError, match="model.vocab_size=128 must equal vocab_size=256"):
        MQARConfig(vocab_size=256)
    with pytest.raises(ValueError, match="max_len=64 is shorter than seq_len=96"):
        MQARConfig(seq_len=96, num_kv_pairs=8)
    with pytest.raises(ValueError, match="unknown field.*num_kv"):
        MQARConfig.from_dict({"num_kv": 4})
    with pytest.raises(ValueError, match="4 \\* num_kv_pairs"):
        MQARConfig(num_kv_pairs=32)
    cfg = MQARConfig.from_dict({"model": {"vocab_size": 128, "d_model": 32, "max_len": 64},
                                "train": {"steps": 7}})
    assert cfg.model.d_model == 32 and cfg.train.steps == 7
    assert TASKS["mqar"][0] is MQARConfig


def test_grids_are_valid_configs():
    fig2 = grid_configs(ZOOLOGY_FIG2_GRID, "attention")
    assert len(fig2) == 4 * 4 * 4  # (L, kv) x d_model x lr
    assert {(c.seq_len, c.num_kv_pairs) for c in fig2} == {(64, 4), (128, 8), (256, 16), (512, 64)}
    assert sorted({c.model.d_model for c in fig2}) == [64, 128, 256, 512]
    assert sorted({c.train.lr for c in fig2}) == pytest.approx([1e-4, 10 ** (-10 / 3), 10 ** (-8 / 3), 1e-2])
    c = fig2[0]
    assert c.vocab_size == c.model.vocab_size == 8192 and c.model.n_layers == 2
    assert c.model.mixer_options == {"n_heads": 1} and c.model.d_ff == 0
    assert c.train.steps == 64 * (100_000 // 512) and c.train.eval_every == 100_000 // 512
    assert c.random_non_queries is False  # zeros in the free slots, as Zoology's figure-2 file
    mamba = grid_configs(ZOOLOGY_FIG2_GRID, "mamba")
    assert mamba[0].model.positions == "none"  # no position embeddings for a recurrent mixer
    assert mamba[0].model.n_layers == 4  # Zoology's figure: 4 layers but for attention's 2
    local = grid_configs(LOCAL_GRID, "sliding_window", {"window": 4}, cache_dir="/tmp/x")
    assert len(local) == 2 * 2 and local[0].model.mixer_options == {"n_heads": 1, "window": 4}
    assert local[0].cache_dir == "/tmp/x"


def test_batches_are_a_pure_function_of_the_step():
    from tasks.engine.batches import epoch_indices as batch_sampler

    pick = batch_sampler(n=10, batch_size=4, seed=3)
    seq = torch.cat([pick(s) for s in range(5)])  # 20 = two epochs of 10; batch 2 straddles them
    again = batch_sampler(n=10, batch_size=4, seed=3)
    backwards = {s: again(s) for s in reversed(range(5))}  # any order of calls, same batches
    assert torch.equal(seq, torch.cat([backwards[s] for s in range(5)]))
    assert sorted(seq[:10].tolist()) == list(range(10)) and sorted(seq[10:].tolist()) == list(range(10))
    assert not torch.equal(seq[:10], seq[10:])  # reshuffled each epoch


class _Solver(torch.nn.Module):
    """An independent MQAR solver: at every token that is a key of the prefix, the
    logits put that key's value first (``shift`` moves the answer off by one)."""

    def __init__(self, kv: int, V: int, shift: int = 0):
        super().__init__()
        self.kv, self.V, self.shift = kv, V, shift
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        pred = torch.zeros_like(x)
        for i, row in enumerate(x.tolist()):
            table = dict(zip(row[0:2 * self.kv:2], row[1:2 * self.kv:2]))
            pred[i] = torch.tensor([table.get(tok, 0) for tok in row])
        pred = (pred + self.shift) % self.V
        return torch.zeros(*x.shape, self.V).scatter(-1, pred[..., None], 1.0)


def test_accuracy_counts_query_positions_only():
    x, y = mqar_examples(30, 32, 4, 100, seed=0)
    assert labelled_accuracy(_Solver(4, 100), x, y, batch_size=7)["accuracy"] == 1.0
    assert labelled_accuracy(_Solver(4, 100, shift=1), x, y, batch_size=7)["accuracy"] == 0.0
    half = y.clone()
    half[:15] = torch.where(half[:15] >= 0, 0, half[:15])  # 0 is never a value
    assert labelled_accuracy(_Solver(4, 100), x, half, batch_size=7)["accuracy"] == 0.5


def test_an_lm_is_scored_from_the_query_logits_alone():
    """labelled_accuracy applies a zoo LM's head at the query positions only: the same accuracy
    and loss as from the whole (B, L, V) logits."""
    x, y = mqar_examples(12, 32, 4, 100, seed=0)
    model = zoo.build_model(zoo.ModelConfig(vocab_size=100, d_model=16, n_layers=2, max_len=32), seed=0)
    whole = torch.nn.Sequential(model)  # not a zoo.LM: called whole
    fast, slow = labelled_accuracy(model, x, y, batch_size=5), labelled_accuracy(whole, x, y, batch_size=5)
    assert fast["accuracy"] == slow["accuracy"]
    assert abs(fast["test_loss"] - slow["test_loss"]) < 1e-5


def _quick(tmp_path, mixer="attention", options=None, **train):
    options = {"n_heads": 1} if options is None else options
    base = MQARConfig(cache_dir=str(tmp_path / "cache"), num_train_examples=2_000, num_test_examples=200)
    return base.replace(model=base.model.replace(mixer=mixer, mixer_options=options),
                        train=base.train.replace(device="cpu", **train))


def test_run_record_and_resume(tmp_path):
    cfg = _quick(tmp_path, steps=20, eval_every=10, checkpoint_every=10)
    rec = run(cfg, workdir=tmp_path / "w", progress=False)
    json.dumps(rec)  # flat and serialisable
    for key in ("status", "accuracy", "params", "params_no_embeddings", "state_size", "mixer_state_size",
                "backends", "tokens_seen", "wall_time", "device", "dtype", "resumed_from"):
        assert key in rec, key
    assert rec["status"] == "ok" and rec["steps"] == 20 and rec["tokens_seen"] == 20 * 64 * 64
    assert rec["state_size"] == 2 * rec["mixer_state_size"] == 2 * (2 * 64 * 64)  # KV cache, 2 layers
    assert 0.0 <= rec["accuracy"] <= 1.0 and rec["backends"] == {"0": "sdpa", "1": "sdpa"}
    assert (tmp_path / "w" / "checkpoint.pt").exists() and rec["resumed_from"] is None
    again = run(cfg, workdir=tmp_path / "w", progress=False)  # a requeued job continues
    assert again["resumed_from"] == 20 and again["accuracy"] == rec["accuracy"]


def test_a_validation_split_picks_the_checkpoint_and_test_is_read_once_there(tmp_path, monkeypatch):
    from tasks.mqar import task as mqar_task
    cfg = _quick(tmp_path, steps=30, eval_every=10).replace(num_val_examples=150)
    valid, test = load_split(cfg, "valid"), load_split(cfg, "test")
    assert len(valid[0]) == 150 and not {tuple(r) for r in valid[0].tolist()} & {tuple(r) for r in test[0].tolist()}
    scored = []
    real = mqar_task.labelled_accuracy

    def spy(m, x, y, b):
        out = real(m, x, y, b)
        scored.append((len(x), out["accuracy"]))
        return out
    monkeypatch.setattr(mqar_task, "labelled_accuracy", spy)
    rec = run(cfg, progress=False)
    assert [n for n, _ in scored] == [150, 150, 150, 200]  # three evaluations on validation, then test once
    assert rec["selected_on"] == "validation" and rec["num_val_examples"] == 150
    assert rec["best_val_accuracy"] == max(a for _, a in scored[:3]) and rec["accuracy"] == scored[3][1]
    assert "final_accuracy" not in rec and rec["final_val_accuracy"] == scored[2][1]
    zoology = run(cfg.replace(num_val_examples=0), progress=False)  # every evaluation on test, the best kept
    assert zoology["selected_on"] == "test" and "best_val_accuracy" not in zoology
    # the field counts in a run id only when set: records made before it keep theirs
    from sweeps.spec import make_run_id
    assert make_run_id("mqar", cfg.replace(num_val_examples=0)) == make_run_id("mqar", _quick(tmp_path, steps=30, eval_every=10))
    assert make_run_id("mqar", cfg) != make_run_id("mqar", cfg.replace(num_val_examples=0))
    with pytest.raises(ValueError, match="num_val_examples"):
        cfg.replace(num_val_examples=-1)


def test_refuses_a_non_causal_model(tmp_path):
    cfg = _quick(tmp_path, "grassmann", {"pairing": "future"}, steps=5)
    with pytest.raises(ValueError, match="non-causal.*grassmann.*future"):
        run(cfg, progress=False)


@contextlib.contextmanager
def one_thread():
    # Tiny matmuls gain nothing from more threads (and lose a lot on a busy machine);
    # one thread also makes the trajectory the same wherever the test runs.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory):
    # The local recipe (MQARConfig's defaults: L=64, kv=4, V=128, d_model 64, one head,
    # lr 3e-3, batch 64): ~650 steps to 0.99, about 25 s of one CPU core.
    cfg = MQARConfig(cache_dir=str(tmp_path_factory.mktemp("mqar")))
    cfg = cfg.replace(train=cfg.train.replace(device="cpu"))
    with one_thread():
        return cfg, run(cfg, progress=False)


def test_attention_solves_mqar(attention_run):
    _, rec = attention_run
    assert rec["accuracy"] >= 0.99 and rec["stopped_early"], rec


def test_short_sliding_window_cannot(attention_run):
    # Same recipe, as many steps as attention needed. A window of 4 (a receptive field
    # of 8 tokens over 2 layers) cannot see most keys from their queries.
    cfg, att = attention_run
    model = cfg.model.replace(mixer="sliding_window", mixer_options={"n_heads": 1, "window": 4})
    with one_thread():
        rec = run(cfg.replace(model=model, train=cfg.train.replace(steps=att["steps"])), progress=False)
    assert rec["accuracy"] < 0.5 < att["accuracy"], (rec["accuracy"], att["accuracy"])


def test_the_mqar_sweep_is_the_grid():
    """sweeps/shipped/mqar.py defines no grid of its own: its runs are grid_configs of ZOOLOGY_FIG2_GRID."""
    from sweeps.spec import load_sweep

    sweep = load_sweep("mqar")
    want = [c for name, options in (("attention", {}), ("sliding_window", {"window": 16}),
                                    ("mamba", {}), ("mamba2", {}), ("rwkv6", {}), ("retnet", {}),
                                    ("grassmann", {}))
            for c in grid_configs(ZOOLOGY_FIG2_GRID, name, options)]
    assert [run.config for run in sweep.runs] == want


def test_the_cpu_sweep_is_zoologys_grid_scaled_down():
    """sweeps/shipped/mqar_cpu.py runs grid_configs of CPU_GRID, which changes only what a CPU
    cannot afford in Zoology's grid (its data law and schedule stay)."""
    from sweeps.spec import load_sweep

    runs = load_sweep("mqar_cpu").runs
    labels = {r.label for r in runs}
    assert {"attention", "sliding_window", "grassmann", "mamba2", "rwkv6", "gated_deltanet",
            "grassmann+attention"} <= labels
    per_point = len(CPU_GRID["d_model"]) * len(CPU_GRID["lr"])
    control = [r.config for r in runs if r.label == "grassmann+positions"]  # L 64 only
    assert {c.seq_len for c in control} == {64} and {c.model.positions for c in control} == {"learned"}
    assert len(control) == per_point and len(CPU_GRID["lr"]) >= 3
    # the local mixers' controls, at L 64 and 128: Zoology's 4 layers, odd offsets, an MLP
    local = {"grassmann 4L": 4, "sliding_window 4L": 4, "grassmann odd offsets": 2, "grassmann+mlp": 2}
    for label, layers in local.items():
        mine = [r.config for r in runs if r.label == label]
        assert {c.seq_len for c in mine} == {64, 128} and len(mine) == 2 * per_point, label
        assert {c.model.n_layers for c in mine} == {layers}, label
    odd = next(r.config for r in runs if r.label == "grassmann odd offsets").model
    assert all(o % 2 for o in odd.mixer_options["offsets"]) and len(odd.mixer_options["offsets"]) == 6
    mlp = next(r.config for r in runs if r.label == "grassmann+mlp").model
    assert mlp.ffn_width == 4 * mlp.d_model and next(r.config for r in runs if r.label == "grassmann").model.ffn_width == 0
    rows = [r for r in runs if r.label not in local and r.config.seed == 0]
    assert len(rows) - len(control) == per_point * len(CPU_GRID["points"]) * (len(labels) - len(local) - 1)
    assert len(CPU_GRID["points"]) >= 3 and len(CPU_GRID["d_model"]) >= 2
    for key in ("power_a", "num_train_examples"):  # defaults or Zoology's, never redefined
        assert CPU_GRID.get(key) == ZOOLOGY_FIG2_GRID.get(key), key
    hybrid = next(r.config for r in runs if r.label == "grassmann+attention")
    assert hybrid.model.layout == "grassmann+attention" and hybrid.model.positions == "none"
    window = next(r.config for r in runs if r.label == "sliding_window")
    assert window.model.mixer_options["window"] == 16 and window.model.positions == "learned"
    by_point = {(r.config.seq_len, r.config.train.steps) for r in runs}
    assert by_point == {(p["seq_len"], p["train"]["steps"]) for p in CPU_GRID["points"]}
    # extra seeds: 1 and 2 at each named point, at one rate of the grid, the rest of the config unchanged
    seeded = [r for r in runs if r.config.seed != 0]
    points = {(r.label, r.config.seq_len, r.config.model.d_model) for r in seeded}
    assert {r.config.seed for r in seeded} == {1, 2} and len(seeded) == 2 * len(points) >= 8
    for r in seeded:
        assert r.config.replace(seed=0) in [q.config for q in runs if q.label == r.label]
