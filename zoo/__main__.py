"""``python -m zoo [--d-model 256] [--seq-len 2048]``: the mixer table of docs/zoo.md,
computed from the code (parameters per mixer, state per sequence, fast path), then
which fast-path kernels can run on this machine and why not."""
from __future__ import annotations

import argparse
import sys

import torch

from . import MIXERS
from .ops import cpu_kernels, status


def mixer_table(d_model: int, seq_len: int) -> list[dict]:
    rows = []
    for name, cls in MIXERS.items():
        with torch.device("meta"):
            m = cls(d_model)
        rows.append({"mixer": name, "params": sum(p.numel() for p in m.parameters()),
                     f"state @ L={seq_len}": m.state_size(seq_len),
                     f"state @ L={2 * seq_len}": m.state_size(2 * seq_len),
                     "MLP by default": "yes" if cls.uses_mlp else "no", "fast path": cls.fast_path})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=2048)
    args = ap.parse_args(argv)
    print_table(mixer_table(args.d_model, args.seq_len))
    print()
    print_table(status() + cpu_kernels.status())  # the CUDA kernels, then the CPU ones


def print_table(rows: list[dict]) -> None:
    cols = list(rows[0])
    print(f"| {' | '.join(cols)} |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:,}" if type(r[c]) is int else str(r[c]) for c in cols) + " |")


if __name__ == "__main__":
    sys.argv[0] = "python -m zoo"  # the usage line names the command, not the file
    main()
