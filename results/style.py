"""One look per mixer, in every figure of every sweep: its colour and marker are keyed on
the mixer, the line style on the variant (a reading of the block, a control, another
sweep's run of the same label).

Colours are Paul Tol's "muted" scheme, which stays apart under the common colour-vision
deficiencies, and black for attention, the control every figure reads against. Markers
differ as well, so two mixers never rely on colour alone. A hybrid "a+b" takes a's colour
and b's marker with a dash-dot line; a mixer not named here (a researcher's own) gets a
colour and marker from its name, the same in every figure.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import pandas as pd

MIXERS = {  # mixer: (colour, marker)
    "attention": ("#000000", "o"),
    "sliding_window": ("#44AA99", "s"),
    "mamba": ("#332288", "^"),
    "mamba2": ("#88CCEE", "v"),
    "rwkv6": ("#117733", "<"),
    "retnet": ("#DDCC77", ">"),
    "gla": ("#999933", "p"),
    "gated_deltanet": ("#882255", "h"),
    "grassmann": ("#CC6677", "D"),
    "mlp": ("#AA4499", "P"),
}
# for mixers outside the zoo: picked by a hash of the name, so stable across figures
SPARE_COLOURS = ("#AA4499", "#DDDDDD", "#6699CC", "#EE7733", "#997700", "#994455")
SPARE_MARKERS = ("X", "*", "d", "8", "H", "P")
VARIANT_DASHES = ("--", ":", (0, (5, 1, 1, 1)), (0, (1, 2)), (0, (8, 2)), (0, (3, 1, 1, 1, 1, 1)))
HYBRID_DASH = "-."


@dataclass(frozen=True)
class Look:
    colour: str
    marker: str
    linestyle: object = "-"

    def csv(self) -> dict:
        """The look as a figure's CSV records it."""
        return {"colour": self.colour, "marker": self.marker, "linestyle": str(self.linestyle)}


def _pick(name: str, options: tuple) -> object:
    return options[zlib.crc32(name.encode()) % len(options)]


def _mixer_look(name: str) -> tuple[str, str]:
    return MIXERS.get(name) or (_pick(name, SPARE_COLOURS), _pick(name, SPARE_MARKERS))


def split_label(label: str, mixer: str | None = None) -> tuple[list[str], str]:
    """A label's mixers (one, or a hybrid's parts) and its variant: "grassmann+attention"
    is (["grassmann", "attention"], ""), "grassmann odd offsets" (["grassmann"], "odd
    offsets"). A label that does not start with a mixer name takes ``mixer``'s."""
    head, _, variant = str(label).partition(" ")
    parts = head.split("+")
    if parts[0] not in MIXERS and mixer and isinstance(mixer, str) and mixer.split("+")[0] in MIXERS:
        return mixer.split("+"), str(label)
    return parts, variant


def look(label: str, mixer: str | None = None) -> Look:
    """The look of one label on its own (its variant's dash chosen by its name)."""
    parts, variant = split_label(label, mixer)
    colour, marker = _mixer_look(parts[0])
    if len(parts) > 1:
        marker = _mixer_look(parts[1])[1]
    dash = _pick(variant, VARIANT_DASHES) if variant else HYBRID_DASH if len(parts) > 1 else "-"
    return Look(colour, marker, dash)


def looks(labels, mixers=None) -> dict[str, Look]:
    """The looks of a figure's labels: as ``look``, with two variants of one mixer that
    would share a dash moved to the next free one."""
    mixers = dict(zip(labels, mixers)) if mixers is not None else {}
    out, taken = {}, {}
    for label in sorted(dict.fromkeys(labels), key=str):
        one = look(label, mixers.get(label))
        key = (one.colour, one.marker)
        if one.linestyle in taken.setdefault(key, set()):
            free = [d for d in ("-", *VARIANT_DASHES) if d not in taken[key]]
            one = Look(one.colour, one.marker, free[0] if free else one.linestyle)
        taken[key].add(one.linestyle)
        out[label] = one
    return out


def mixer_of(rows: pd.DataFrame) -> dict[str, str]:
    """Each label's mixer, where the records name one."""
    if "mixer" not in rows:
        return {}
    return rows.dropna(subset=["mixer"]).groupby("label")["mixer"].first().to_dict()
