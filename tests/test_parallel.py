"""One run over several processes (tasks.engine.parallel): DDP and FSDP2 on the CPU with
gloo and 2 processes end where one process with the same global batch ends, and so does
gradient accumulation; a checkpoint written by 2 ranks resumes in one process."""
from __future__ import annotations

import os
import socket
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp

import zoo
from tasks.engine import parallel
from tasks.engine.losses import labelled_lm_loss, lm_loss
from tasks.engine.train import TrainConfig, train

MODEL = zoo.ModelConfig(vocab_size=61, d_model=32, n_layers=2, mixer="attention", max_len=16, d_ff=64,
                        dropout=0.0)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(MODEL.vocab_size, (8, MODEL.max_len + 1), generator=torch.Generator().manual_seed(step))
    return tokens[:, :-1], tokens[:, 1:]  # (8, L) each: the global batch


def _labelled_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, targets = _batch(step)
    targets = targets.clone()
    targets[:, ::3] = -100  # the same number of labelled positions in every sequence
    return inputs, targets


def _train(cfg: TrainConfig, dtype: torch.dtype, checkpoint=None, loss=lm_loss, mixer="attention",
           status="ok") -> dict:
    torch.manual_seed(0)
    model = zoo.build_model(zoo.ModelConfig(**{**MODEL.to_dict(), "mixer": mixer}), seed=0).to(dtype)
    batches = _labelled_batch if loss is labelled_lm_loss else _batch
    res = train(model, cfg, batches, loss, checkpoint=checkpoint, progress=False)
    assert res.status == status, res
    return {"params": parallel.full_state(model), "loss": res.final_loss, "steps": res.steps}


class _NaNOnRank1:
    """``lm_loss``, but NaN on rank 1 alone from its ``after``-th call on."""

    def __init__(self, after: int):
        self.after, self.calls = after, 0

    def __call__(self, net, batch):
        self.calls += 1
        loss = lm_loss(net, batch)
        return loss * float("nan") if parallel.world().rank == 1 and self.calls >= self.after else loss


def _worker(rank: int, world: int, port: int, out: str, kwargs: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    result = _train(**kwargs)
    if rank == 0:
        torch.save(result, out)
    torch.distributed.barrier()  # both ranks are past their last collective and rank 0 has saved
    # Leave without tearing gloo down: the C++ teardown (destroy_process_group, or the
    # interpreter's exit) aborted a rank now and then ("terminate called without an active
    # exception"), failing a run that had finished; a stress loop of these runs saw no abort
    # this way. A rank that raises exits through mp.spawn, which reports its traceback.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _in_two_processes(tmp_path, timeout_s: float = 300, **kwargs) -> dict:
    out = str(tmp_path / "rank0.pt")
    ranks = mp.spawn(_worker, args=(2, _free_port(), out, kwargs), nprocs=2, join=False)
    deadline = time.monotonic() + timeout_s
    while not ranks.join(timeout=1):  # raises when a rank failed
        if time.monotonic() > deadline:
            for p in ranks.processes:
                p.kill()
            pytest.fail(f"the 2 ranks did not finish in {timeout_s:.0f} s: a collective one rank skipped?")
    return torch.load(out, weights_only=False)


def _assert_same(got: dict, want: dict, dtype: torch.dtype) -> None:
    assert got["steps"] == want["steps"] and set(got["params"]) == set(want["params"])
    # float64: to round-off, element by element; float32: each tensor within 1e-5 of its
    # norm (Adam divides by the root of tiny second moments, so a rarely seen embedding row
    # moves a whole step on a last-bit difference in its gradient's summation order)
    for name, value in want["params"].items():
        if dtype == torch.float64:
            torch.testing.assert_close(got["params"][name], value, rtol=1e-10, atol=1e-12,
                                       msg=lambda m: f"{name}: {m}")
        else:
            err = ((got["params"][name] - value).norm() / value.norm()).item()
            assert err <= 1e-5, f"{name}: relative error {err:.2e}"
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-6)  # the loss is float32 (lm_loss)


CFG = dict(steps=5, batch_size=8, lr=1e-2, warmup_steps=2, eval_every=100, device="cpu")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_two_processes_end_where_one_process_ends(tmp_path, strategy, dtype):
    # float32 on Mamba-2: attention's key bias has no gradient but round-off (softmax
    # ignores a shift shared by every key), which Adam scales to whole steps
    mixer = "attention" if dtype == torch.float64 else "mamba2"
    want = _train(TrainConfig(**CFG), dtype, mixer=mixer)
    # and with each rank's 4 sequences in two micro-batches of 2
    for micro in (0, 2):
        got = _in_two_processes(tmp_path, cfg=TrainConfig(**CFG, strategy=strategy, micro_batch_size=micro),
                                dtype=dtype, mixer=mixer)
        _assert_same(got, want, dtype)


def test_labelled_loss_goes_through_the_wrapped_forward(tmp_path):
    # MQAR and MAD apply the head at their labelled positions: under FSDP2 that call must
    # be the root module's forward, which gathers the head's and embeddings' shards
    want = _train(TrainConfig(**CFG), torch.float64, loss=labelled_lm_loss)
    got = _in_two_processes(tmp_path, cfg=TrainConfig(**CFG, strategy="fsdp"), dtype=torch.float64,
                            loss=labelled_lm_loss)
    _assert_same(got, want, torch.float64)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_nan_on_one_rank_stops_every_rank_at_the_same_step(tmp_path, strategy):
    # rank 1's loss turns NaN on the first micro-batch of step 2 (its 3rd call): it must
    # still join the backward passes' collectives, and both ranks must stop there
    cfg = TrainConfig(**CFG, strategy=strategy, micro_batch_size=2)
    got = _in_two_processes(tmp_path, timeout_s=120, cfg=cfg, dtype=torch.float64, loss=_NaNOnRank1(after=3),
                            status="diverged")
    assert got["steps"] == 1 and got["loss"] != got["loss"]  # one step taken, the NaN reported


def test_gradient_accumulation_in_one_process_is_the_same_step():
    want = _train(TrainConfig(**CFG), torch.float64, mixer="mamba2")
    _assert_same(_train(TrainConfig(**CFG, micro_batch_size=2), torch.float64, mixer="mamba2"), want, torch.float64)


def test_a_checkpoint_of_two_sharded_ranks_resumes_in_one_process(tmp_path):
    want = _train(TrainConfig(**CFG), torch.float64)
    ckpt = tmp_path / "checkpoint.pt"
    # the 2-rank run checkpoints at step 3 (only) and goes on to the end
    got = _in_two_processes(tmp_path, cfg=TrainConfig(**CFG, strategy="fsdp", checkpoint_every=3),
                            dtype=torch.float64, checkpoint=str(ckpt))
    _assert_same(got, want, torch.float64)
    state = torch.load(ckpt, weights_only=False)
    assert state["result"].steps == 3 and not any(hasattr(v, "placements") for v in state["model"].values())
    resumed = _train(TrainConfig(**CFG), torch.float64, checkpoint=ckpt)  # steps 4 and 5, one process
    _assert_same(resumed, want, torch.float64)


def test_the_global_batch_must_split_over_the_processes():
    with pytest.raises(ValueError, match="batch_size=6 does not split over 4 processes"):
        TrainConfig(batch_size=6).micro_batch(4)
    with pytest.raises(ValueError, match="micro_batch_size=3 must divide the 4 sequences"):
        TrainConfig(batch_size=8, micro_batch_size=3).micro_batch(2)
    assert TrainConfig(batch_size=8).micro_batch(2) == 4
    with pytest.raises(ValueError, match="strategy='zero' is not valid.*'ddp', 'fsdp'"):
        TrainConfig(strategy="zero")
