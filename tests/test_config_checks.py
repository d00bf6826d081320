"""Config checks that name the field (issue 13, item 8): types from the hints, ranges
in each config, and every bad config of a sweep file reported at once with its index
and label."""
from __future__ import annotations

import math

import pytest

import zoo
from sweeps import SweepError, load_sweep
from tasks.mqar.task import MQARConfig
from tasks.benchmarks.scaling import ScalingConfig
from tasks.engine.train import TrainConfig
from zoo.config import InvalidConfig, InvalidConfigError, collecting


# the bad values, each refused with the field (and its config) in the message
@pytest.mark.parametrize("cls, bad, message", [
    (TrainConfig, dict(steps="300"), "TrainConfig: steps='300' must be an int"),
    (TrainConfig, dict(warmup_steps=-10), "TrainConfig: warmup_steps=-10 must be >= 0"),
    (TrainConfig, dict(checkpoint_every=-1), "TrainConfig: checkpoint_every=-1 must be >= 0"),
    (TrainConfig, dict(lr=math.nan), "TrainConfig: lr=nan must be finite"),
    (MQARConfig, dict(seed="zero"), "MQARConfig: seed='zero' must be an int"),
    # and their neighbours
    (TrainConfig, dict(steps=300.0), "steps=300.0 must be an int"),
    (TrainConfig, dict(batch_size=True), "batch_size=True must be an int"),
    (TrainConfig, dict(lr=math.inf), "lr=inf must be finite"),
    (TrainConfig, dict(lr="1e-3"), "lr='1e-3' must be a float"),
    (TrainConfig, dict(lr=0), "lr=0 must be > 0"),
    (TrainConfig, dict(min_lr_ratio=1.5), "min_lr_ratio=1.5 must be <= 1"),
    (TrainConfig, dict(weight_decay=-0.1), "weight_decay=-0.1 must be >= 0"),
    (TrainConfig, dict(grad_clip=-1.0), "grad_clip=-1.0 must be >= 0"),
    (TrainConfig, dict(device=0), "device=0 must be a str"),
    (MQARConfig, dict(seed=-1), "MQARConfig: seed=-1 must be >= 0"),
    (MQARConfig, dict(seed=1.0), "MQARConfig: seed=1.0 must be an int"),
    (ScalingConfig, dict(mixer_options=[("window", 8)]), "mixer_options=.* must be a dict"),
    (zoo.ModelConfig, dict(dropout=1.0), "ModelConfig: dropout=1.0 must be < 1"),
])
def test_bad_values_are_refused_naming_the_field(cls, bad, message):
    with pytest.raises(ValueError, match=message):
        cls(**bad)
    with pytest.raises(ValueError, match=message):  # the dict path (records, --set) too
        cls.from_dict(bad)


def test_valid_values_pass_and_optional_fields_take_none():
    cfg = TrainConfig(steps=10, lr=1, min_lr_ratio=0, warmup_steps=0, grad_clip=0, target=None)
    assert cfg.lr == 1 and cfg.target is None  # an int is a valid float, kept as given
    assert TrainConfig(target=0.5).target == 0.5
    with pytest.raises(ValueError, match="target='high' must be a float"):
        TrainConfig(target="high")


def test_nested_dict_configs_are_rebuilt_and_their_errors_name_the_field():
    cfg = MQARConfig.from_dict({"train": {"steps": 5, "betas": [0.9, 0.99]},
                                "model": {"vocab_size": 128, "max_len": 64, "d_model": 32}})
    assert isinstance(cfg.train, TrainConfig) and cfg.train.steps == 5
    assert cfg.train.betas == (0.9, 0.99)  # a JSON list back into the tuple field
    assert isinstance(cfg.model, zoo.ModelConfig) and cfg.model.d_model == 32
    assert MQARConfig(train={"steps": 5}).train == TrainConfig(steps=5)  # keywords too
    with pytest.raises(ValueError, match="MQARConfig: train: warmup_steps=-10 must be >= 0"):
        MQARConfig.from_dict({"train": {"warmup_steps": -10}})
    with pytest.raises(ValueError, match="MQARConfig: model must be a ModelConfig or a dict"):
        MQARConfig(model="attention")


def test_collecting_returns_a_placeholder_and_outside_it_raises():
    with collecting():
        bad = TrainConfig(warmup_steps=-10)
        outer = MQARConfig(train=bad)
        good = TrainConfig(steps=5)
    assert isinstance(bad, InvalidConfig) and bad.error == "TrainConfig: warmup_steps=-10 must be >= 0"
    assert isinstance(outer, InvalidConfig) and outer.error == "MQARConfig: train: warmup_steps=-10 must be >= 0"
    assert isinstance(good, TrainConfig)
    assert bad.replace(steps=3) is bad  # a variant of an invalid config stays invalid
    with pytest.raises(InvalidConfigError, match="warmup_steps=-10"):
        bad.steps
    with pytest.raises(ValueError, match="warmup_steps=-10"):  # the context is gone
        TrainConfig(warmup_steps=-10)


def _write_sweep(path, body: str):
    path.write_text("from sweeps import RunConfig\nfrom tasks.engine.train import TrainConfig\n"
                    "from tasks.mqar.task import MQARConfig\n" + body)
    return path


def test_a_sweep_reports_every_bad_config_with_index_and_label(tmp_path):
    path = _write_sweep(tmp_path / "bad.py", """
configs = [
    RunConfig("mqar", MQARConfig(seed=0), label="good"),
    RunConfig("mqar", MQARConfig(seed=1, train=TrainConfig(warmup_steps=-10)), label="warm"),
    RunConfig("mqar", MQARConfig(seed=2), label="good2"),
    RunConfig("mqar", MQARConfig(seed="zero"), label="seedy"),
    RunConfig("mqar", MQARConfig(seed=3).replace(train=TrainConfig(steps="300")), label="steps"),
]
""")
    with pytest.raises(SweepError) as err:
        load_sweep(path)
    msg = str(err.value)
    assert "3 invalid" in msg
    assert "config #1 (warm): MQARConfig: train: warmup_steps=-10 must be >= 0" in msg
    assert "config #3 (seedy): MQARConfig: seed='zero' must be an int" in msg
    assert "config #4 (steps): MQARConfig: train: steps='300' must be an int" in msg
    assert "config #0" not in msg and "config #2" not in msg
    with pytest.raises(ValueError, match="warmup_steps=-10"):  # loading left no context behind
        TrainConfig(warmup_steps=-10)


def test_a_good_sweep_still_loads(tmp_path):
    path = _write_sweep(tmp_path / "good.py", """
base = MQARConfig()
configs = [RunConfig("mqar", base.replace(seed=s, train=base.train.replace(steps=20)), label=f"s{s}")
           for s in range(2)]
configs.append(RunConfig("mqar", {"seed": 5, "train": {"steps": 20, "betas": [0.9, 0.99]}}, label="dict"))
""")
    sweep = load_sweep(path)
    assert [r.label for r in sweep.runs] == ["s0", "s1", "dict"]
    assert all(isinstance(r.config, MQARConfig) for r in sweep.runs)
    assert sweep.runs[2].config.train.betas == (0.9, 0.99)


def test_every_bad_field_of_a_config_is_named_at_once():
    with pytest.raises(ValueError) as err:
        TrainConfig(lr=math.nan, warmup_steps=-5)
    assert str(err.value) == "TrainConfig: lr=nan must be finite; warmup_steps=-5 must be >= 0"
    # a wrong type, a bad choice and a bound, one reason per field
    with pytest.raises(ValueError) as err:
        TrainConfig(steps="3", batch_size=0, precision="x")
    assert str(err.value) == ("TrainConfig: steps='3' must be an int; precision='x' is not valid; choose one of "
                              "['auto', 'fp32', 'bf16']; batch_size=0 must be > 0")
    with pytest.raises(ValueError, match="num_kv_pairs=-2 must be > 0"):
        MQARConfig(num_kv_pairs=-2)


def test_cli_numbers_are_refused_before_sbatch(capsys):
    from sweeps.cli import main
    for flag, value in (("--mem-gb", "-1"), ("--gpus", "0"), ("--tasks-per-node", "0"), ("--cpus-per-task", "x")):
        with pytest.raises(SystemExit) as exit_:
            main(["run", "smoke", "--executor", "slurm", flag, value])
        assert exit_.value.code == 2
        assert f"argument {flag}:" in capsys.readouterr().err


def test_a_renamed_field_reads_the_old_name_from_a_record_only():
    assert TrainConfig.from_dict({"steps": 3, "amp": True}).precision == "auto"  # a record made before precision
    with pytest.raises(ValueError, match=r"amp=False \(now precision\) has no reading; readable: \[True\]"):
        TrainConfig.from_dict({"amp": False})
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['amp'\]"):  # both names: the old one is unknown
        TrainConfig.from_dict({"amp": True, "precision": "bf16"})
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['amp'\]"):  # and never in code
        TrainConfig(amp=True)
