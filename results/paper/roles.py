"""The models a verdict reads, named by the config fields that make them, not by a sweep's
labels: a sweep may rename a label, and a verdict keyed on the old one would quietly turn
"pending". ``by_role`` gives every record that a role's fields pick out the role's name
as its label, so the verdicts read the same rows whatever the sweep called them.
"""
from __future__ import annotations

import json

import pandas as pd

# A role: {field under config.model: value}; None means the field is unset (absent from the
# record's config). Fields a role leaves out are not read.
Role = dict

# mqar_cpu's models as its findings read them (results.paper.findings)
MQAR_ROLES: dict[str, Role] = {
    "attention": {"mixer": "attention", "n_layers": 2, "hybrid.mixer": None},
    "sliding_window": {"mixer": "sliding_window", "n_layers": 2},
    "sliding_window 4L": {"mixer": "sliding_window", "n_layers": 4},
    "grassmann": {"mixer": "grassmann", "n_layers": 2, "positions": "none", "hybrid.mixer": None, "d_ff": 0,
                  "mixer_options.offsets": None},
    "grassmann+positions": {"mixer": "grassmann", "n_layers": 2, "positions": "learned", "hybrid.mixer": None},
    "grassmann+attention": {"mixer": "grassmann", "hybrid.mixer": "attention"},
    "grassmann 4L": {"mixer": "grassmann", "n_layers": 4},
    "grassmann odd offsets": {"mixer": "grassmann", "n_layers": 2, "mixer_options.offsets": [1, 3, 5, 9, 13, 17]},
    "grassmann+mlp": {"mixer": "grassmann", "n_layers": 2, "d_ff": None},
    **{m: {"mixer": m, "n_layers": 2, "hybrid.mixer": None} for m in ("mamba2", "rwkv6", "gated_deltanet")},
}

# the Wikitext-2 models the gap verdicts read (results.paper.findings.gap_placement and
# reading_gaps): the paper's post-LN block and each other reading of it, for both mixers
LM_ROLES: dict[str, Role] = {
    "attention": {"mixer": "attention", "block": "postnorm", "init_std": None, "hybrid.mixer": None},
    "grassmann": {"mixer": "grassmann", "block": "postnorm", "init_std": None, "mixer_options.mixing": None,
                  "hybrid.mixer": None},
    "grassmann gated_residual": {"mixer": "grassmann", "block": "postnorm", "init_std": None,
                                 "mixer_options.mixing": "gated_residual", "hybrid.mixer": None},
    "grassmann pre-LN": {"mixer": "grassmann", "block": "prenorm", "init_std": None, "mixer_options.mixing": None,
                         "hybrid.mixer": None},
    "attention pre-LN": {"mixer": "attention", "block": "prenorm", "init_std": None, "hybrid.mixer": None},
    "grassmann pre-LN small init": {"mixer": "grassmann", "block": "prenorm", "init_std": 0.02,
                                    "mixer_options.mixing": None, "hybrid.mixer": None},
    "attention pre-LN small init": {"mixer": "attention", "block": "prenorm", "init_std": 0.02, "hybrid.mixer": None},
}


def _same(column: pd.Series, value) -> pd.Series:
    if value is None:
        return column.isna()
    if isinstance(value, (list, tuple)):
        return column.map(lambda v: isinstance(v, (list, tuple)) and json.dumps(list(v)) == json.dumps(list(value)))
    return column == value


def by_role(frame: pd.DataFrame, roles: dict[str, Role]) -> pd.DataFrame:
    """``frame`` with each record that a role picks out labelled by the role's name (the
    others keep theirs). A record two roles pick out is refused: the roles must tell the
    models apart."""
    if frame.empty:
        return frame
    hits = {}
    for name, role in roles.items():
        mask = pd.Series(True, index=frame.index)
        for field, value in role.items():
            column = f"config.model.{field}"
            mask &= _same(frame[column], value) if column in frame else pd.Series(value is None, index=frame.index)
        hits[name] = mask
    both = [(a, b) for i, a in enumerate(hits) for b in list(hits)[i + 1:] if (hits[a] & hits[b]).any()]
    if both:
        raise ValueError(f"roles {both[0][0]!r} and {both[0][1]!r} pick out the same records; "
                         "give one a field that tells them apart")
    out = frame.copy()
    for name, mask in hits.items():
        out.loc[mask, "label"] = name
    return out
