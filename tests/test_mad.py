"""tasks.mad: configs refuse what MAD's settings cannot be, a run trains and scores the
test positions MAD scores, and compression decodes every position from one state."""
import json
import math

import pytest
import torch

import zoo
from tasks import TASKS
from tasks.engine.losses import labelled_accuracy
from tasks.mad.task import Compressor, MADConfig, load_split, mad_metrics, mad_reported, model_config, run
from tasks.mad.data import IGNORE


def _tiny(tmp_path, task="in-context-recall", **setting):
    base = MADConfig(task=task)
    full = {**base.full_setting, "num_train_examples": 64, "num_test_examples": 32, **setting}
    model = base.model.replace(d_model=16, d_ff=32)
    return MADConfig(task=task, setting=full, model=model, cache_dir=str(tmp_path),
                     train=base.train.replace(steps=6, batch_size=8, eval_every=3, device="cpu"))


def test_config_names_the_bad_field():
    with pytest.raises(ValueError, match="task='copying'.*selective-copying"):
        MADConfig(task="copying")
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['frac_noise'\].*valid fields"):
        MADConfig(setting={"frac_noise": 0.5})  # in-context recall has no noise
    with pytest.raises(ValueError, match="seq_len"):
        MADConfig(task="selective-copying", setting={"seq_len": 8})  # 16 tokens to copy do not fit
    # the model takes the setting's vocabulary and length
    assert model_config(MADConfig(task="memorization")).vocab_size == 256
    assert model_config(MADConfig(setting={"seq_len": 256})).max_len == 256
    assert TASKS["mad"][0] is MADConfig


@pytest.mark.parametrize("task", ["in-context-recall", "compression", "memorization"])
def test_a_run_trains_and_scores_the_test_positions(tmp_path, task):
    setting = {"vocab_size": 32, "seq_len": 8} if task == "memorization" else {"seq_len": 32}
    cfg = _tiny(tmp_path, task, **setting)
    rec = run(cfg, workdir=tmp_path / "w", progress=False)
    json.dumps(rec)
    assert rec["task"] == "mad" and rec["mad_task"] == task and rec["steps"] == 6
    assert 0.0 <= rec["accuracy"] <= rec["best_accuracy"] <= 1.0 and rec["mad_seq_len"] == cfg.full_setting["seq_len"]
    assert rec["reported_step"] in (3, 6) and rec["perplexity"] >= 1.0  # MAD's pick of the two evaluations
    assert json.loads(rec["setting"]) == cfg.full_setting
    again = load_split(cfg, "test")  # cached: the same data from the file
    assert torch.equal(again[0], load_split(cfg, "test")[0])


@pytest.mark.parametrize("task", ["in-context-recall", "compression"])
def test_a_validation_split_picks_the_checkpoint_and_test_is_read_once_there(tmp_path, monkeypatch, task):
    from tasks.mad import task as mad_task
    cfg = _tiny(tmp_path, task, seq_len=32).replace(num_val_examples=24)
    valid, test = load_split(cfg, "valid"), load_split(cfg, "test")
    assert len(valid[0]) == 24 and not {tuple(r) for r in valid[0].tolist()} & {tuple(r) for r in test[0].tolist()}
    scored = []
    real = mad_task.mad_metrics

    def spy(m, x, y, b, v):
        out = real(m, x, y, b, v)
        scored.append((len(x), out))
        return out
    monkeypatch.setattr(mad_task, "mad_metrics", spy)
    rec = run(cfg, progress=False)
    assert [n for n, _ in scored] == [24, 24, 32]  # two evaluations on validation, then test once
    chosen = min(scored[:2], key=lambda s: s[1]["perplexity"])[1]  # MAD's rule, on validation
    assert rec["selected_on"] == "validation" and rec["best_val_accuracy"] == chosen["accuracy"]
    assert rec["val_perplexity"] == chosen["perplexity"] and rec["accuracy"] == scored[2][1]["accuracy"]
    assert rec["perplexity"] == scored[2][1]["perplexity"] and "best_accuracy" not in rec
    assert run(cfg.replace(num_val_examples=0), progress=False)["selected_on"] == "test"
    from sweeps.spec import make_run_id  # counts in a run id only when set
    assert make_run_id("mad", cfg.replace(num_val_examples=0)) == make_run_id("mad", _tiny(tmp_path, task, seq_len=32))
    with pytest.raises(ValueError, match="num_val_examples"):
        cfg.replace(num_val_examples=-2)


def test_accuracy_counts_scored_positions_only():
    x = torch.randint(10, (4, 6))
    y = torch.full_like(x, IGNORE)
    y[:, 1] = x[:, 1]  # right
    y[:, 3] = (x[:, 3] + 1) % 10  # wrong
    assert labelled_accuracy(_Echo(10), x, y, batch_size=3)["accuracy"] == 0.5
    assert mad_metrics(_Echo(10), x, y, batch_size=3, num_classes=10)["pooled_accuracy"] == 0.5


class _Echo(torch.nn.Module):  # predicts each position's own input token
    def __init__(self, classes):
        super().__init__()
        self.classes, self.w = classes, torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return torch.nn.functional.one_hot(x, self.classes).float() + 0 * self.w


def test_mad_metrics_are_torchmetrics_macro_accuracy_per_test_batch():
    """MAD's accuracy: per test batch, each class's hit rate over the classes the batch has as
    a target or as a prediction (a class predicted but never a target scores 0), averaged over
    the batches; its perplexity likewise per batch. Counted by hand."""
    x = torch.tensor([[1, 1, 1, 2], [4, 0, 0, 0]])
    y = torch.tensor([[1, 1, 1, 3], [4, IGNORE, IGNORE, IGNORE]])  # batch 1: class 2 predicted, 3 missed
    m = mad_metrics(_Echo(5), x, y, batch_size=1, num_classes=5)
    assert m["accuracy"] == pytest.approx((1 / 3 + 1) / 2)  # classes {1, 2, 3}: 1, 0, 0; then {4}: 1
    assert m["pooled_accuracy"] == pytest.approx(4 / 5)
    e = math.e  # one-hot logits: the right token has e / (e + 4), a wrong one 1 / (e + 4)
    assert m["perplexity"] == pytest.approx((e + 4) * (math.exp(-3 / 4) + math.exp(-1)) / 2)
    # one batch of both: classes {1, 2, 3, 4} score 1, 0, 0, 1: MAD's number depends on its batch size
    assert mad_metrics(_Echo(5), x, y, batch_size=2, num_classes=5)["accuracy"] == pytest.approx(0.5)
    # batches weigh by their sequences: (the two above: 0.5) x 2 and (the second alone: 1) x 1
    three = mad_metrics(_Echo(5), torch.cat([x, x[1:]]), torch.cat([y, y[1:]]), batch_size=2, num_classes=5)
    assert three["accuracy"] == pytest.approx((2 * 0.5 + 1.0) / 3)
    with pytest.raises(ValueError, match="no scored position"):
        mad_metrics(_Echo(5), x, torch.full_like(y, IGNORE), batch_size=2, num_classes=5)


def test_mad_reports_the_evaluation_of_lowest_perplexity():
    history = [{"step": 5, "accuracy": 0.99, "perplexity": math.nan}, {"step": 10, "accuracy": 0.90, "perplexity": 2.0},
               {"step": 20, "accuracy": 0.95, "perplexity": 2.5}]
    assert mad_reported(history)["step"] == 10  # not the best accuracy: mad-lab keeps the best-perplexity checkpoint
    assert mad_reported([]) == {}


def test_compression_decodes_every_position_from_the_last_state():
    lm = zoo.build_model(zoo.ModelConfig(vocab_size=12, d_model=16, n_layers=1, max_len=10), seed=0)
    model = Compressor(lm, 10)
    x = torch.randint(12, (2, 10))
    out = model(x)
    assert out.shape == (2, 10, 12)
    changed = x.clone()
    changed[:, 0] = (x[:, 0] + 1) % 12  # the first token reaches the code through the last state
    assert not torch.allclose(model(changed)[:, 5], out[:, 5])


def test_sweep_configs_follow_mads_protocol():
    """MAD's 3 lr x 2 weight decays per setting, 200 epochs of each setting's own data
    (so fewer examples mean fewer steps), a cosine to 1e-6, MAD's layer options, and a
    step cap only where asked."""
    from tasks.mad.task import MAD_LRS, MAD_WEIGHT_DECAYS, sweep_configs
    settings = [("in-context-recall", {}), ("in-context-recall", {"num_train_examples": 800}),
                ("memorization", {"vocab_size": 512})]
    cfgs = sweep_configs("attention", settings)
    assert len(cfgs) == 3 * len(MAD_LRS) * len(MAD_WEIGHT_DECAYS)
    assert {(c.train.lr, c.train.weight_decay) for c in cfgs[:6]} == {(lr, wd) for lr in MAD_LRS
                                                                      for wd in MAD_WEIGHT_DECAYS}
    assert [c.train.steps for c in cfgs[::6]] == [200 * 100, 200 * 7, 200 * 2]  # 12,800, 800, 256 examples
    assert all(c.train.lr * c.train.min_lr_ratio == pytest.approx(1e-6) for c in cfgs)
    first = cfgs[0].model
    assert first.mixer_options == {"n_heads": 1, "rotary": 128} and first.positions == "none"
    assert cfgs[-1].full_setting["vocab_size"] == 512 and cfgs[-1].task == "memorization"
    capped = sweep_configs("mamba2", settings[:1], lrs=(1e-3,), weight_decays=(0.0,), max_steps=500,
                           batch_size=32, options={"d_state": 8}, warmup_steps=5, target=0.99)
    assert [(c.train.steps, c.train.batch_size, c.train.eval_every, c.train.warmup_steps, c.train.target)
            for c in capped] == [(500, 32, 50, 5, 0.99)]
    assert {(c.train.warmup_steps, c.train.target) for c in cfgs} == {(0, None)}  # MAD has none, and no stop
    assert capped[0].model.mixer_options == {"d_state": 8} and capped[0].model.positions == "none"


def test_the_cpu_sweep_runs_every_mixer_and_seeds_where_no_mixer_saturates():
    """sweeps/shipped/mad_cpu.py: every zoo mixer on every task's baseline at seed 0, one
    change per task for the varied mixers, and seeds 1 and 2 at the baselines of the
    seeded tasks only, each the seed-0 config with its seed changed."""
    import zoo
    from sweeps import load_sweep
    from tasks.mad.data import BASELINES

    runs = load_sweep("mad_cpu").runs
    first = [r for r in runs if r.config.seed == 0]
    base = {(r.label, r.config.task) for r in first if not r.config.setting}
    assert base == {(m, t) for m in zoo.MIXERS for t in BASELINES}
    more = [r for r in runs if r.config.seed != 0]
    assert {r.config.seed for r in more} == {1, 2} and not any(r.config.setting for r in more)
    assert {r.config.task for r in more} == {"compression", "selective-copying"}
    assert len(more) == 2 * 2 * len(zoo.MIXERS)
    seed0 = {(r.label, r.config.task): r.config for r in first if not r.config.setting}
    assert all(r.config.replace(seed=0) == seed0[r.label, r.config.task] for r in more)
    assert len({r.run_id for r in runs}) == len(runs)
