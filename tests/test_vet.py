"""``linbench vet``: a card for a mixer from outside the zoo, in one command. The correctness
checks come first and a mixer that fails one gets a card that names the check and trains
nothing; otherwise the recall and cost stages run as a sweep and the card reads them."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import zoo
from results.card import _verdict
from sweeps.cli import main as cli
from sweeps.spec import local_data_dir

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def outside_on_path(monkeypatch):
    """The outside mixers reach the child processes of the local executor as a user's
    package would: on PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(TESTS))


def card(tmp_path, mixer: str) -> tuple[str, Path]:
    assert cli(["vet", mixer, "--budget", "test", "--results-dir", str(tmp_path)]) == 0
    path = next((tmp_path / "vet").glob("*/test/report.md"))
    return path.read_text(), path.parent


def test_a_correct_outside_mixer_gets_every_section(tmp_path):
    text, folder = card(tmp_path, "outside_mixers.shift:ShiftMix")
    assert text.startswith("# linbench vet: outside_mixers.shift:ShiftMix\n\nBudget **test**")
    assert re.search(r"seeds 0; CPU .*; commit [0-9a-f]{12}", text)
    verdicts = text.split("## Verdicts")[1].split("\n## ")[0]
    assert "| correct: causal, returns its update, trains finite (fp32, bf16) | 9 of 9 checks pass | holds |" in verdicts
    assert "recall (MQAR, L 32, d 16)" in verdicts and "cost: training step faster than attention at L 64" in verdicts
    for section in ("## Correctness", "## Recall: MQAR", "## Capabilities: MAD's six tasks",
                    "## Language modelling: Wikitext-2", "## Cost: the training step against L"):
        assert section in text
    for figure in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (folder / figure).is_file()
    lm = 2 if local_data_dir() else 0  # Wikitext-2 runs where the data is here: it and attention
    decodes = sum(zoo.mixer_class(m).has_step_form() for m in ("outside_mixers.shift:ShiftMix", "attention"))
    # MQAR (it and 2 controls), MAD (6 tasks x 2), training-step timings (it and attention), decode timings
    assert len(list(folder.glob("*.json"))) == 3 + 12 + lm + 2 + decodes
    assert ("language modelling (Wikitext-2): lower validation perplexity" in verdicts) == bool(lm)
    assert "capabilities (MAD): score above attention's" in verdicts
    # a second vet resumes: nothing reruns, the same card
    assert cli(["vet", "outside_mixers.shift:ShiftMix", "--budget", "test", "--results-dir", str(tmp_path)]) == 0


@pytest.mark.parametrize("mixer, check", [("outside_mixers.broken:Peek", "causal: the mixer"),
                                          ("outside_mixers.broken:NanGrad", "forward: finite outputs"),
                                          ("outside_mixers.broken:WrongStep", "step form = parallel form (float64)")])
def test_a_failing_check_ends_the_card_there(tmp_path, mixer, check):
    text, folder = card(tmp_path, mixer)
    assert f"| stopped at: {check} |" in text and "does not hold" in text
    assert "The card stops here" in text and "## Recall" not in text
    assert not list(folder.glob("*.json"))  # nothing trained or timed
    assert "Traceback" not in text


def test_verdicts_need_a_gap_beyond_noise_and_the_seeds_spread():
    assert _verdict([0.9], [0.5]) == "holds"
    assert _verdict([0.5], [0.9]) == "does not hold"
    assert _verdict([0.52], [0.5]) == "not separable"  # within SEPARABLE on one seed a side
    assert _verdict([0.9, 0.1, 0.95], [0.5, 0.55, 0.45]) == "not separable"  # bimodal seeds: no verdict


def test_vet_takes_one_mixer(tmp_path, capsys):
    assert cli(["vet", "attention,mamba", "--budget", "test", "--results-dir", str(tmp_path)]) == 2
    assert "put the others in --against" in capsys.readouterr().err
