"""The verdicts name the models they read by config fields (results.paper.roles), so a
sweep that renames a label leaves every verdict as it was; roles that cannot tell two
models apart are refused."""
from pathlib import Path

import pandas as pd
import pytest

from results.paper.findings import gap_placement, reading_gaps, zoology_findings
from results.paper.headline import read_published
from results.paper.roles import MQAR_ROLES, by_role
from results.records import load_records, records_frame

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"


def renamed(frame: pd.DataFrame) -> pd.DataFrame:
    """Every label spelled otherwise, as a sweep file might."""
    return frame.assign(label=frame["label"].map(lambda label: f"my {label.upper()}"))


def test_the_mqar_findings_read_the_same_under_other_labels():
    frame = records_frame(load_records(REFERENCE / "mqar_cpu"))
    assert zoology_findings(renamed(frame)) == zoology_findings(frame)


def test_the_wikitext2_gaps_read_the_same_under_other_labels():
    frame = records_frame(load_records(REFERENCE / "wikitext2_6L_cpu"))
    published = read_published()
    assert reading_gaps(renamed(frame)) == reading_gaps(frame)
    assert gap_placement(renamed(frame), published) == gap_placement(frame, published)


def test_roles_that_pick_out_the_same_records_are_refused():
    frame = pd.DataFrame({"label": ["a", "b"], "config.model.mixer": ["gla", "gla"], "config.model.n_layers": [2, 4]})
    assert list(by_role(frame, {"two": {"mixer": "gla", "n_layers": 2}})["label"]) == ["two", "b"]
    with pytest.raises(ValueError, match="'one' and 'any' pick out the same records"):
        by_role(frame, {"one": {"mixer": "gla", "n_layers": 2}, "any": {"mixer": "gla"}})
    assert set(MQAR_ROLES) >= {"attention", "grassmann", "grassmann 4L", "sliding_window 4L"}
