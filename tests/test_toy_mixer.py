"""A new mixer is one file and one registry line: a toy mixer defined here, registered
for the test only (no file but this one touched), goes through everything a shipped
mixer goes through: the shared harness of tests/test_mixers.py, a tasks.benchmarks.scaling
measurement, an LM training step (the MQAR task on tiny synthetic data), its FLOPs
(the base Mixer's default, FlopCounterMode) and a sweep's ``--dry-run``.

The registration is a monkeypatch of ``zoo.MIXERS``: visible in this process only. The
paths that build mixers in child processes (tasks.benchmarks.scaling with isolate=True, the local
and Slurm executors' submitit jobs) look the name up in a fresh interpreter, so a real
mixer is registered where every process imports it: its line in zoo/mixers/__init__.py.
Here those paths run in-process (isolate=False, the sweep's dry run).
"""
from __future__ import annotations

import inspect
import itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import test_decode as decode_harness  # the step-form harness
import test_mixers as harness  # the shared harness (tests/ is on sys.path under pytest)
import zoo
from sweeps.cli import main as cli
from zoo.flops import flops
from tasks.mqar.task import LOCAL_GRID, MQARConfig, grid_configs
from zoo.model import positions_for
from tasks.mqar.task import run as run_mqar
from tasks.benchmarks.scaling import ScalingConfig
from tasks.benchmarks.scaling import run as run_scaling
from tasks.engine.train import TrainConfig
from tasks.wikitext2 import paper_model_config
from zoo.mixers.base import check_divisible, check_positive

TOY = "toy_conv"


class ToyConv(zoo.Mixer):
    """y = W_o silu(causal conv of W_i x over the last ``width`` tokens), one filter per
    head shared by that head's channels: a causal mixer with an ``n_heads`` option (so
    the wikitext2 preset's rule "n_heads for every mixer that takes it" applies to it)
    and no core_flops of its own (so the base default counts it)."""

    name = TOY

    def __init__(self, d_model: int, n_heads: int = 2, width: int = 3):
        super().__init__()
        check_divisible(self.name, d_model, n_heads)
        check_positive(self.name, width, "width")
        self.n_heads, self.width = n_heads, width
        self.proj = nn.Linear(d_model, d_model)
        self.taps = nn.Parameter(torch.randn(n_heads, width) / width)  # (H, width); last tap: token t
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # left padding by width - 1: window t holds tokens t-width+1 .. t, never a later one
        self.backend = "torch"
        return self._conv(F.pad(self.proj(x), (0, 0, self.width - 1, 0)))

    def _conv(self, h: torch.Tensor) -> torch.Tensor:
        """h (B, width - 1 + L, D): the width - 1 tokens before the L outputs' first, then theirs."""
        B, T, D = h.shape
        if T < self.width:  # no output (an empty prefill): unfold needs one whole window
            return h[:, :0]
        win = h.view(B, T, self.n_heads, D // self.n_heads).unfold(1, self.width, 1)  # (B, L, H, D/H, width)
        y = torch.einsum("blhdw,hw->blhd", win, self.taps.to(h.dtype))
        return self.out(F.silu(y).reshape(B, -1, D))

    def state_size(self, seq_len: int) -> int:
        return (self.width - 1) * self.d_model  # the last width - 1 projected tokens

    # its step form: the last width - 1 projected tokens, zeros before the start
    def init_state(self, batch: int, device=None, dtype=None) -> dict:
        return {"past": torch.zeros(batch, self.width - 1, self.d_model, device=device, dtype=dtype)}

    def prefill(self, x: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        h = torch.cat([state["past"], self.proj(x)], 1)  # (B, width - 1 + L, D)
        return self._conv(h), {"past": h[:, h.shape[1] - (self.width - 1):]}


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    # zoo.MIXERS is the registry itself (zoo.mixers.MIXERS, read by build_mixer and ModelConfig)
    monkeypatch.setitem(zoo.MIXERS, TOY, ToyConv)


def test_the_toy_is_defined_here_and_counted_by_the_default():
    assert TOY not in harness.NAMES  # registered for these tests only, after the harness was imported
    assert "core_flops" not in ToyConv.__dict__ and ToyConv.option_names == ("n_heads", "width")


# ------------------------------------------------------------------ the shared harness

_PARAM = type(pytest.param())  # what pytest.param(...) makes


def _rows(names: list[str], values) -> list[tuple]:
    """A parametrize mark's values as tuples, one entry per argument name."""
    return [v.values if isinstance(v, _PARAM) else v if len(names) > 1 else (v,) for v in values]


def harness_cases(mixer: str = TOY):
    """(check, arguments) for every check of tests/test_mixers.py that runs once per
    registered mixer (a ``name`` parametrized over every name in the registry), with
    ``mixer`` (the toy, or an import path) as the mixer and the check's other
    parametrizations read from its marks: checks added there run here too."""
    registered = set(zoo.MIXERS) - {TOY}  # the shipped mixers (the toy is not in NAMES)
    for check_name, fn in inspect.getmembers(harness, inspect.isfunction):
        axes, per_mixer = [], False
        for mark in getattr(fn, "pytestmark", []):
            if mark.name != "parametrize":
                continue
            names, values = mark.args[0], mark.args[1]
            names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
            rows = _rows(names, values)
            if names == ["name"]:
                per_mixer = registered <= {row[0] for row in rows}
                continue
            axes.append([dict(zip(names, row)) for row in rows])
        if not (check_name.startswith("test_") and per_mixer):
            continue
        for combo in itertools.product(*axes):
            kwargs = {"name": mixer}
            for part in combo:
                kwargs.update(part)
            yield pytest.param(fn, kwargs, id=f"{check_name}[{'-'.join(map(str, kwargs.values()))}]")


def run_check(check, kwargs: dict, request) -> None:
    """Call a harness check with ``kwargs``; arguments that are fixtures there (tmp_path,
    ...) are fixtures here too."""
    fixtures = {arg: request.getfixturevalue(arg) for arg in inspect.signature(check).parameters if arg not in kwargs}
    check(**kwargs, **fixtures)


@pytest.mark.parametrize("check, kwargs", list(harness_cases()))
def test_shared_harness(check, kwargs, request):
    run_check(check, kwargs, request)


def test_harness_cases_cover_the_checks():
    checks = {case.values[0].__name__ for case in harness_cases()}
    assert {"test_shape_and_dtype", "test_mixer_is_causal", "test_model_is_causal",
            "test_match_params_against_attention"} <= checks


# ------------------------------------------------------- scaling, FLOPs, training, sweep

@pytest.mark.parametrize("prompt", decode_harness.PROMPTS)
def test_step_form_by_the_decode_harness(prompt):
    torch.manual_seed(0)
    decode_harness.assert_steps_match(ToyConv(decode_harness.D, n_heads=4, width=3), prompt)


def test_flops_by_the_base_default():
    B, L, D, width = 3, 16, 32, 3
    m = ToyConv(D, width=width)
    core = 2 * B * L * D * width  # the einsum: width taps per channel, a multiply-add each
    assert m.core_flops(B, L) == core and m.bwd_ratio == 2.0
    dense = 2 * B * L * 2 * D * D  # proj and out, counted from their weights by zoo.flops
    assert flops(m, B, L) == {"fwd": dense + core, "fwd_bwd": 3 * dense + 3 * core}


def test_scaling_measurement_in_process():
    cfg = ScalingConfig(mixer=TOY, d_model=32, min_len=16, max_len=32, tokens=64, warmup=0, repeats=1,
                        device="cpu", isolate=False)  # a child process would not know the toy
    rec = run_scaling(cfg, progress=False)
    assert rec["mixer"] == TOY and rec["n_ok"] == 4
    for p in rec["points"]:
        B, L = p["batch"], p["seq_len"]
        dense, core = 2 * B * L * 2 * 32 * 32, 2 * B * L * 32 * 3
        assert p["status"] == "ok" and p["backend"] == "torch" and p["state_size"] == 2 * 32
        assert p["flops"] == (dense + core if p["pass"] == "fwd" else 3 * (dense + core))


def test_lm_training_step_through_the_mqar_task(tmp_path):
    model = zoo.ModelConfig(vocab_size=32, d_model=16, n_layers=1, max_len=16, d_ff=0, mixer=TOY,
                            mixer_options={"n_heads": 4}, positions=positions_for(TOY))
    cfg = MQARConfig(model=model, seq_len=16, num_kv_pairs=2, vocab_size=32, num_train_examples=16,
                     num_test_examples=8, cache_dir=str(tmp_path),
                     train=TrainConfig(steps=2, batch_size=4, warmup_steps=1, eval_every=2, device="cpu"))
    rec = run_mqar(cfg, workdir=tmp_path / "run", progress=False)
    assert rec["status"] == "ok" and rec["steps"] == 2 and rec["mixer"] == TOY
    assert rec["backends"] == {"0": "torch"} and 0 <= rec["accuracy"] <= 1
    assert rec["mixer_state_size"] == 2 * 16


def test_presets_read_the_mixer_not_a_list():
    # wikitext2: the preset's n_heads goes to every mixer that takes n_heads
    assert paper_model_config(TOY, "tiny").mixer_options == {"n_heads": 4}
    # MQAR (Zoology): positions for the mixers blind to order without them; the toy is not
    assert positions_for(TOY) == "none" and positions_for("attention") == "learned"
    assert positions_for("attention", {"rotary": 8}) == "none"  # rotary attention brings its own
    assert grid_configs(LOCAL_GRID, TOY)[0].model.positions == "none"
    assert grid_configs(LOCAL_GRID, "attention", {"rotary": 8})[0].model.positions == "none"


SWEEP = '''"""A sweep of the toy mixer, written by tests/test_toy_mixer.py."""
from sweeps import RunConfig, matched_models
from tasks.mqar.task import MQARConfig
from tasks.benchmarks.scaling import ScalingConfig
from tasks.wikitext2 import paper_model_config, preset_config

base = paper_model_config("attention", "tiny")
toy = matched_models(base, {"toy": ("toy_conv", {"n_heads": 4})}, knob="auto")["toy"]
mqar = MQARConfig()
configs = [
    RunConfig("scaling", ScalingConfig(mixer="toy_conv", d_model=32, device="cpu"), label="toy scaling"),
    RunConfig("wikitext2", preset_config("tiny", "toy_conv", model=toy), label="toy wikitext2"),
    RunConfig("mqar", mqar.replace(model=mqar.model.replace(mixer="toy_conv")), label="toy mqar"),
]
'''


def test_sweep_dry_run(tmp_path, capsys):
    path = tmp_path / "toy_sweep.py"
    path.write_text(SWEEP)
    assert cli(["run", str(path), "--dry-run", "--results-dir", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert "3 configs valid" in out
    for label in ("toy scaling", "toy wikitext2", "toy mqar"):
        assert label in out
    assert not any((tmp_path / "results").rglob("*.json"))  # validated and listed, nothing run
