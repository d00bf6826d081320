"""Registering a mixer never changes a reference result: the sweeps with committed records
name their mixers, so a researcher's mixer added to the registry joins only the
exploratory sweeps (smoke, scaling, decode), and every reference run id, run count and
headline table stays what it was."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "results" / "reference"
EXPLORATORY = {"smoke"}  # reference records, but a demo of whatever is registered

# Run in a child, so the registration cannot leak into other tests: with "register" it adds
# a toy mixer to the registry first (what its one line in zoo/mixers/__init__.py does).
CHILD = '''
import json, sys
import torch.nn as nn
import zoo

if sys.argv[1] == "register":
    class Toy(zoo.Mixer):
        name = "toy_registered"

        def __init__(self, d_model: int):
            super().__init__()
            self.lin = nn.Linear(d_model, d_model)

        def forward(self, x):
            return self.lin(x)

        def state_size(self, seq_len: int) -> int:
            return 0

        def init_state(self, batch, device=None, dtype=None):
            return {}

        def prefill(self, x, state):
            return self.lin(x), state

    zoo.MIXERS["toy_registered"] = Toy

from results.paper import headline
from sweeps import load_sweep

names = sorted(json.loads(sys.argv[2]))
ids = {name: sorted(run.run_id for run in load_sweep(name).runs) for name in names}
tables = headline.tables({s: len(ids[s]) if s in ids else len(load_sweep(s).runs) for s in headline.reference_sweeps()})
print(json.dumps({"ids": ids, "tables": tables}))
'''


def _child(mode: str, sweeps: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", CHILD, mode, json.dumps(sweeps)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_registering_a_mixer_changes_no_reference_run_or_table():
    sweeps = sorted({p.parent.name for p in REFERENCE.glob("*/*.json")})
    children = {mode: _child(mode, sweeps) for mode in ("plain", "register")}
    out = {}
    for mode, child in children.items():
        stdout, stderr = child.communicate(timeout=600)
        assert child.returncode == 0, stderr[-2000:]
        out[mode] = json.loads(stdout.splitlines()[-1])
    plain, registered = out["plain"], out["register"]
    for name in sweeps:
        before, after = set(plain["ids"][name]), set(registered["ids"][name])
        if name in EXPLORATORY:
            assert before < after, f"{name} should time a newly registered mixer too"
        else:
            assert before == after, f"{name}: registering a mixer changed its runs ({len(before)} -> {len(after)})"
    assert plain["tables"] == registered["tables"]
