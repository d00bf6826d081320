"""results.paper.readings: each reading of the Grassmann block against attention built the
same way, on small synthetic records."""
import pandas as pd

from results.paper.readings import reading_verdicts, reads_as, stated_block

BLOCKS = {"": ("postnorm", None, None), " gated_residual": ("postnorm", None, "gated_residual"),
          " pre-LN": ("prenorm", None, None), " pre-LN small init": ("prenorm", 0.02, None)}


def _run(mixer, reading, seed, val, lr=1e-3, setting="6L/128"):
    """A wikitext2 record as the 6-layer sweep writes it, labelled by anything: the roles
    read its config."""
    block, init, mixing = BLOCKS[reading]
    return {"task": "wikitext2", "run_status": "ok", "label": f"run {mixer}{reading} {seed}", "mixer": mixer,
            "setting": setting, "seed": seed, "best_val_ppl": val, "config.train.lr": lr,
            "config.model.mixer": mixer, "config.model.block": block, "config.model.init_std": init,
            "config.model.mixer_options.mixing": mixing}


PUBLISHED = pd.DataFrame([
    {"task": "wikitext2", "source": "a/post", "setting": "6L/128", "mixer": m, "split": "validation", "value": v,
     "note": "post-norm; 30 epochs"} for m, v in (("attention", 100.0), ("grassmann", 130.0))] + [
    {"task": "wikitext2", "source": "b/pre", "setting": "6L/128", "mixer": m, "split": "validation", "value": v,
     "note": "pre-norm with N(0, 0.02) init"} for m, v in (("attention", 100.0), ("grassmann", 95.0))] + [
    {"task": "wikitext2", "source": "c/deep", "setting": "12L/256", "mixer": m, "split": "validation", "value": v,
     "note": None} for m, v in (("attention", 100.0), ("grassmann", 150.0))])


def test_each_reading_reads_against_attention_of_its_own_block_at_each_ones_best_rate():
    rows = [_run("attention", "", s, v) for s, v in ((0, 100.0), (1, 101.0), (2, 99.0))]
    rows += [_run("attention", "", 0, 150.0, lr=2e-3)]  # a worse rate: not read
    rows += [_run("grassmann", "", s, v, lr=2e-3) for s, v in ((0, 120.0), (1, 121.0), (2, 122.0))]
    rows += [_run("grassmann", " gated_residual", s, v) for s, v in ((0, 99.0), (1, 103.0), (2, 100.0))]
    rows += [_run("attention", " pre-LN", s, v) for s, v in ((0, 110.0), (1, 111.0), (2, 109.0))]
    rows += [_run("grassmann", " pre-LN", s, v) for s, v in ((0, 100.0), (1, 101.0), (2, 99.5))]
    rows += [_run("grassmann", " pre-LN small init", 0, 104.0), _run("attention", " pre-LN small init", 0, 94.0)]
    text = reading_verdicts(pd.DataFrame(rows), PUBLISHED)
    lines = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in text.splitlines()[2:6]}
    assert lines["grassmann"][1:3] == ["post-LN", "attention"] and lines["grassmann"][4:6] == ["3 / 3", "trails"]
    assert lines["grassmann"][3].startswith("+21.0 % [")  # 121 over 100, geometric means
    assert lines["grassmann gated_residual"][1:3] == ["post-LN, gated residual", "attention"]
    assert lines["grassmann gated_residual"][5] == "closes the gap"
    assert lines["grassmann pre-LN"][2] == "attention pre-LN" and lines["grassmann pre-LN"][5] == "reverses the gap"
    # the best attention of any block: the small-init pre-LN one, on its one seed
    assert lines["grassmann pre-LN"][6].startswith("+6.6 % (attention pre-LN small init)")
    small = lines["grassmann pre-LN small init"]
    assert small[2:6] == ["attention pre-LN small init", "+10.6 %", "1 / 1", "one seed on a side: no verdict (in the "
                                                                              "paper's 10–15 %)"]
    assert small[6].strip(" |") == "+10.6 % (attention pre-LN small init)"
    assert text.endswith("Published at 6L/128, each against its own Transformer: a/post +30.0 % (post-LN); "
                         "b/pre −5.0 % (pre-LN, small init).")


def test_a_reading_without_attention_in_its_block_and_a_depth_nobody_published():
    rows = [_run("grassmann", " pre-LN", 0, 100.0, setting="12L/64"), _run("attention", "", 0, 90.0, setting="12L/64")]
    text = reading_verdicts(pd.DataFrame(rows), PUBLISHED)
    assert "| grassmann pre-LN | pre-LN | – | no attention in this block yet | – | – | +11.1 % (attention) |" in text
    assert text.endswith("No published gap at 12L/64.")
    assert reading_verdicts(pd.DataFrame(rows).assign(run_status="failed"), PUBLISHED) == "*No finished run yet.*"


def test_what_a_gap_reads_as_and_the_block_a_note_states():
    assert reads_as(0.12, 0.11, 0.13) == "trails (in the paper's 10–15 %)"
    assert reads_as(-0.02, -0.05, 0.01) == "closes the gap" and reads_as(-0.1, -0.2, -0.01) == "reverses the gap"
    assert reads_as(0.3, None, None) == "one seed on a side: no verdict"
    assert stated_block("bert tokenizer; pre-norm (model.pre_norm=true) with N(0, 0.02) init") == "pre-LN, small init"
    assert stated_block("post-norm (pre_norm=false)") == "post-LN" and stated_block(float("nan")) == "block not stated"
