"""docs/extending.md's mixer skeleton, pasted as it stands into a package outside zoo/,
passes the shared harness and the step-form harness unchanged, named by its import path."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

import test_decode as decode_harness
import zoo
from test_toy_mixer import harness_cases, run_check

DOC = Path(__file__).resolve().parent.parent / "docs" / "extending.md"
SKELETON = "my_mixers.ema:EmaMix"


def skeleton_source() -> str:
    block = DOC.read_text().split("<!-- skeleton -->", 1)[1].split("<!-- /skeleton -->", 1)[0]
    return re.search(r"```python\n(.*?)```", block, re.S).group(1)


@pytest.fixture(scope="module", autouse=True)
def pasted(tmp_path_factory):
    """The skeleton in my_mixers/ema.py of a fresh folder on sys.path, as a user would have it."""
    root = tmp_path_factory.mktemp("outside")
    (root / "my_mixers").mkdir()
    (root / "my_mixers" / "__init__.py").write_text("")
    (root / "my_mixers" / "ema.py").write_text(skeleton_source())
    sys.path.insert(0, str(root))
    yield
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m.startswith("my_mixers")]:
        del sys.modules[name]


def test_the_skeleton_is_outside_the_zoo_and_has_the_documented_signature():
    cls = zoo.mixer_class(SKELETON)
    assert SKELETON not in zoo.MIXERS and cls.__module__ == "my_mixers.ema"
    assert cls.option_names == ("init_decay",) and cls.has_step_form()
    m = cls(8)
    state = m.init_state(2, torch.device("cpu"), torch.float64)  # what every caller passes
    assert state["s"].dtype == torch.float64 and state["s"].shape == (2, 8)


# collected at import, before the fixture puts the package on sys.path: only the checks'
# names and arguments are read here, the mixer is built when each runs
@pytest.mark.parametrize("check, kwargs", list(harness_cases(SKELETON)))
def test_the_skeleton_passes_the_shared_harness(check, kwargs, request):
    run_check(check, kwargs, request)


@pytest.mark.parametrize("prompt", decode_harness.PROMPTS)
def test_the_skeletons_step_form_equals_its_parallel_form(prompt):
    torch.manual_seed(0)
    decode_harness.assert_steps_match(zoo.mixer_class(SKELETON)(decode_harness.D), prompt)
