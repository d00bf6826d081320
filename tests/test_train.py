"""The shared training loop (tasks.engine.train): schedule, divergence, early stop, best
weights, and exact resume after an interruption, including a real SIGTERM."""
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import zoo
from tasks.engine.losses import lm_loss
from tasks.engine.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- schedule


def test_warmup_then_cosine_values():
    cfg = TrainConfig(steps=110, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert cfg.lr_at(0) == pytest.approx(1e-4)  # linear warm-up from lr / warmup
    assert cfg.lr_at(4) == pytest.approx(5e-4)
    assert cfg.lr_at(9) == pytest.approx(1e-3)
    assert cfg.lr_at(10) == pytest.approx(1e-3)  # cosine starts at the peak
    assert cfg.lr_at(60) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # half-way
    assert cfg.lr_at(110) == pytest.approx(1e-4)  # floor = lr * min_lr_ratio
    assert cfg.lr_at(500) == pytest.approx(1e-4)  # and it stays there
    lrs = [cfg.lr_at(s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_loop_applies_the_schedule():
    # With a constant gradient, Adam's first moments are exact and each update is
    # lr_t * g / (|g| + eps): the weight's steps read off the learning rate used.
    cfg = TrainConfig(steps=12, lr=1e-2, warmup_steps=4, min_lr_ratio=0.0, weight_decay=0.0,
                      grad_clip=0.0, eval_every=100, device="cpu")
    model = nn.Linear(1, 1, bias=False)
    seen = []

    def loss_fn(m, batch):
        seen.append(m.weight.item())
        return m.weight.sum() * 3.0

    train(model, cfg, lambda step: (), loss_fn, progress=False)
    seen.append(model.weight.item())
    steps = [a - b for a, b in zip(seen, seen[1:])]
    expected = [cfg.lr_at(s) * 3.0 / (3.0 + 1e-8) for s in range(cfg.steps)]
    assert steps == pytest.approx(expected, rel=1e-4, abs=1e-9)


# ---------------------------------------------------------------- precision


@pytest.mark.parametrize("precision, device, bf16", [("auto", "cpu", False), ("fp32", "cpu", False),
                                                      ("bf16", "cpu", True), ("auto", "cuda", True),
                                                      ("fp32", "cuda", False)])
def test_precision_says_when_autocast_is_on(precision, device, bf16):
    assert TrainConfig(precision=precision).bf16(torch.device(device)) is bf16


def test_precision_names_the_valid_choices():
    with pytest.raises(ValueError, match=r"precision.*'auto', 'fp32', 'bf16'"):
        TrainConfig(precision="fp16")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bf16_precision_trains_under_autocast_on_cpu(precision):
    from tasks.engine.runs import run_fields
    seen = []

    def loss_fn(m, batch):
        out = m(batch[0])
        seen.append(out.dtype)
        return (out.float() - batch[1]).pow(2).mean()

    evals = []
    cfg = TrainConfig(steps=30, lr=1e-2, warmup_steps=0, eval_every=10, device="cpu", precision=precision)
    res = train(_toy(), cfg, _batch, loss_fn, eval_fn=lambda m: evals.append(m(torch.ones(1, 4)).dtype) or {},
                progress=False)
    want = torch.bfloat16 if precision == "bf16" else torch.float32
    assert set(seen) == set(evals) == {want}  # training steps and evaluations alike
    assert res.final_loss < 0.75 * _mse(_toy(), _batch(0)).item()  # it learns
    fields = run_fields(res, cfg, seed=0)
    assert fields["precision"] == precision and fields["dtype"] == str(want).replace("torch.", "")
    # the training loop kept the allocator's large blocks (glibc), and the record says so
    import os
    assert fields["malloc_tuned"] is (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")


# ---------------------------------------------------------------- outcomes


def _toy(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _batch(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(16, 4, generator=g)
    return x, x.sum(-1, keepdim=True)


def _mse(model, batch):
    x, y = batch
    return (model(x) - y).pow(2).mean()


def test_nan_loss_is_diverged_not_an_exception():
    calls = []

    def loss_fn(m, batch):
        calls.append(1)
        loss = _mse(m, batch)
        return loss * float("nan") if len(calls) == 4 else loss  # the 4th step blows up

    cfg = TrainConfig(steps=20, lr=1e-2, warmup_steps=0, eval_every=5, device="cpu")
    res = train(_toy(), cfg, _batch, loss_fn, progress=False)
    assert res.status == "diverged"
    assert res.steps == 3 and math.isnan(res.final_loss)


def test_early_stop_at_target():
    scores = iter([0.2, 0.5, 0.91, 0.95, 0.99])
    cfg = TrainConfig(steps=50, lr=1e-2, eval_every=5, target=0.9, device="cpu")
    res = train(_toy(), cfg, _batch, _mse, eval_fn=lambda m: {"acc": next(scores)}, metric="acc",
                higher_is_better=True, progress=False)
    assert res.stopped_early and res.status == "ok"
    assert res.steps == 15 and res.best == 0.91
    assert [h["step"] for h in res.history] == [5, 10, 15]


def test_best_state_is_the_weights_of_the_best_evaluation():
    losses = iter([0.9, 0.3, 0.5, 0.4])  # best (lowest) at the second evaluation
    snapshots = []

    def eval_fn(m):
        snapshots.append({k: v.clone() for k, v in m.state_dict().items()})
        return {"loss": next(losses)}

    cfg = TrainConfig(steps=20, lr=1e-2, warmup_steps=0, eval_every=5, device="cpu")
    model = _toy()
    res = train(model, cfg, _batch, _mse, eval_fn=eval_fn, progress=False)
    assert res.best == 0.3 and len(snapshots) == 4
    for k, v in res.best_state.items():
        assert torch.equal(v, snapshots[1][k])
        assert v.device.type == "cpu"
    assert not torch.equal(res.best_state["0.weight"], model.state_dict()["0.weight"])


# ---------------------------------------------------------------- exact resume
# A tiny LM with dropout, so that a resume must also restore the RNG to be exact.

RESUME_STEPS = 40


def _lm_setup():
    cfg = zoo.ModelConfig(vocab_size=50, d_model=16, n_layers=2, max_len=16, dropout=0.1,
                          mixer_options={"n_heads": 2})
    model = zoo.build_model(cfg, seed=0)
    tcfg = TrainConfig(steps=RESUME_STEPS, batch_size=4, lr=3e-3, warmup_steps=5, eval_every=10,
                       checkpoint_every=5, device="cpu")

    def batch_fn(step):
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randint(50, (4, 16), generator=g)
        return x, torch.roll(x, -1, dims=1)
    return model, tcfg, batch_fn


def worker(checkpoint: str, step_sleep: float) -> None:
    """Run by test_sigterm_then_resume in a subprocess: trains slowly until killed."""
    torch.set_num_threads(1)
    torch.manual_seed(123)
    model, tcfg, batch_fn = _lm_setup()

    def slow_batch(step):
        time.sleep(step_sleep)
        return batch_fn(step)

    train(model, tcfg, slow_batch, lm_loss, checkpoint=checkpoint, progress=False)


def _uninterrupted():
    torch.manual_seed(123)
    model, tcfg, batch_fn = _lm_setup()
    return model, train(model, tcfg, batch_fn, lm_loss, progress=False)


@pytest.fixture
def one_thread():
    # the subprocess runs on one thread; same kernels, same rounding, same bits
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_sigterm_then_resume_is_exact(tmp_path, one_thread):
    ckpt = tmp_path / "checkpoint.pt"
    code = (f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]; "
            f"import test_train; test_train.worker({str(ckpt)!r}, 0.05)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not ckpt.exists():
            assert proc.poll() is None, "worker ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == -signal.SIGTERM  # checkpointed, then the default action
    finally:
        proc.kill()
    state = torch.load(ckpt, weights_only=False)
    stopped = state["result"].steps
    assert 5 <= stopped < RESUME_STEPS

    torch.manual_seed(999)  # the checkpoint's RNG state must win over the caller's
    model, tcfg, batch_fn = _lm_setup()
    resumed = train(model, tcfg, batch_fn, lm_loss, checkpoint=ckpt, progress=False)
    ref_model, ref = _uninterrupted()
    assert resumed.resumed_from == stopped and resumed.steps == RESUME_STEPS
    assert resumed.final_loss == ref.final_loss
    assert [h["train_loss"] for h in resumed.history] == [h["train_loss"] for h in ref.history]
    for k, v in ref_model.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def test_ignored_signal_reports_interrupted_and_resumes_exactly(tmp_path, one_thread):
    # A signal whose previous handler ignores it: the loop checkpoints, returns
    # "interrupted", and the next call continues where it stopped.
    ckpt = tmp_path / "checkpoint.pt"
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        torch.manual_seed(123)
        model, tcfg, batch_fn = _lm_setup()
        tcfg = tcfg.replace(checkpoint_every=0)  # only the signal writes a checkpoint

        def batch_with_signal(step):
            if step == 7:
                os.kill(os.getpid(), signal.SIGUSR1)
            return batch_fn(step)

        first = train(model, tcfg, batch_with_signal, lm_loss, checkpoint=ckpt, progress=False)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert first.status == "interrupted" and ckpt.exists()
    assert 8 <= first.steps < RESUME_STEPS
    model, _, _ = _lm_setup()
    resumed = train(model, tcfg, batch_fn, lm_loss, checkpoint=ckpt, progress=False)
    _, ref = _uninterrupted()
    assert resumed.status == "ok" and resumed.resumed_from == first.steps
    assert resumed.final_loss == ref.final_loss


def test_marked_parameters_get_no_weight_decay():
    """Mamba's A_log is a (d_inner, d_state) matrix, but mamba_ssm never decays it; RWKV-6's
    (5, D) mixing coefficients and (H, K) bonus likewise. The optimiser's groups honour
    the mixers' ``_no_weight_decay`` marks; Linear weights still decay."""
    from tasks.engine.train import _optimizer, no_decay_names
    for mixer, marked in (("mamba", ("A_log",)), ("rwkv6", ("time_maa", "time_faaaa", "time_maa_w1"))):
        model = zoo.build_model(zoo.ModelConfig(vocab_size=50, d_model=32, n_layers=1, max_len=16,
                                                mixer=mixer), seed=0)
        decayed, kept = (_optimizer(model, TrainConfig(weight_decay=0.1), no_decay_names(model)).param_groups[i]
                          for i in (0, 1))
        assert decayed["weight_decay"] == 0.1 and kept["weight_decay"] == 0.0
        names = {id(p): n for n, p in model.named_parameters()}
        no_decay = {names[id(p)].rsplit(".", 1)[-1] for p in kept["params"]}
        assert set(marked) <= no_decay, no_decay
        assert any(names[id(p)].endswith("out_proj.weight") or names[id(p)].endswith("output.weight")
                   for p in decayed["params"])


def test_labelled_loss_is_the_lm_loss_with_the_head_where_labels_are():
    from tasks.engine.losses import labelled_lm_loss

    torch.manual_seed(0)
    model = zoo.build_model(zoo.ModelConfig(vocab_size=50, d_model=16, n_layers=2, max_len=12))
    x = torch.randint(50, (3, 12))
    y = torch.full((3, 12), -100)
    y[:, 3::4] = torch.randint(50, (3, 3))  # a few labelled slots, as MQAR's queries
    params = list(model.parameters())
    want = lm_loss(model, (x, y))
    got = labelled_lm_loss(model, (x, y))
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got, params), torch.autograd.grad(want, params)):
        torch.testing.assert_close(a, b)
