"""The command-line plumbing every task and benchmark shares: the run flags, ``--set``
overrides, parsing a ``--mixers`` list, and printing or writing rows."""
from __future__ import annotations

import argparse
import ast
import csv
import dataclasses
import json
from pathlib import Path

import zoo

from . import parallel


def apply_sets(cfg, sets: list[str]):
    """A config with ``a.b=value`` overrides applied (values parsed as JSON, else kept
    as strings); unknown keys fail in the config's own from_dict."""
    return type(cfg).from_dict(set_values(cfg.to_dict(), sets))


def set_values(data: dict, sets: list[str]) -> dict:
    """``data`` (a config as a dict) with the ``a.b=value`` overrides written in."""
    data = json.loads(json.dumps(data, default=list))  # a copy; tuples as lists, as to_dict gives them
    for item in sets:
        key, _, text = item.partition("=")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        *path, last = key.split(".")
        node = data
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return data


def config_from_sets(config_class, sets: list[str], **fields):
    """``config_class`` from its defaults, ``fields`` and the ``--set`` overrides, validated
    once with all of them in: a config whose default is not valid on its own (the corpus
    task's empty ``source``) is built from what the command line says."""
    data = {}
    for f in dataclasses.fields(config_class):
        if f.default is not dataclasses.MISSING:
            data[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            data[f.name] = value.to_dict() if hasattr(value, "to_dict") else value
    return config_class.from_dict(set_values({**data, **fields}, sets))


def add_run_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags every task CLI shares: seed, device, checkpoint folder, record file, overrides."""
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--workdir", type=Path, default=None, help="checkpoint.pt lives here (resume)")
    ap.add_argument("--out", type=Path, default=None, help="write the JSON record here")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override any config field, e.g. model.n_layers=2 or train.lr=3e-4")



def run_from_cli(cfg, args: argparse.Namespace, run, show) -> dict:
    """Apply --device and --set, run, write --out, print ``show(record)``. Started by
    torchrun (``torchrun --nproc-per-node N -m tasks ...``), every process trains the run
    (tasks.engine.parallel) and rank 0 writes and prints."""
    # a training task's device is its train.device; a measuring task (scaling) has its own
    cfg = cfg.replace(train=cfg.train.replace(device=args.device)) if hasattr(cfg, "train") \
        else cfg.replace(device=args.device)
    cfg = apply_sets(cfg, args.set)
    record = run(cfg, args.workdir)
    if parallel.world().main:  # under torchrun every rank ran it; rank 0 reports
        if args.out:
            args.out.write_text(json.dumps(record, indent=1))
        print(show(record))
    return record



def write_csv(rows: list[dict], path: Path) -> None:
    """``rows`` (dicts with the first row's keys) to a CSV at ``path``, folders made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {path}")


def mixer_label(name: str, options: dict) -> str:
    """The inverse of one ``parse_mixers`` item: ("sliding_window", {"window": 64}) ->
    "sliding_window:window=64", the name a benchmark's rows and tables carry."""
    return ":".join([name, *(f"{k}={v}" for k, v in options.items())])


def mixer_name(name: str) -> str:
    """argparse's type for a --mixer: a registered mixer or an import path (module:Class),
    else a one-line refusal that lists the registered ones."""
    try:
        zoo.mixer_class(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return name


def parse_mixers(spec: str) -> list[tuple[str, dict]]:
    """"attention,sliding_window:window=64,my_pkg.mixers:Mine:width=3" -> [(name, options)]:
    a name is a registered mixer or an import path (module:Class). Values are Python
    literals where they parse (64, (1, 2), True), else strings."""
    items, depth = [""], 0
    for ch in spec:  # split on the commas outside brackets: offsets=(1,2) stays whole
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            items.append("")
        else:
            items[-1] += ch
    out = []
    for item in filter(None, map(str.strip, items)):
        name, *opts = item.split(":")
        # "package.module:Class[:key=value...]" (a dotted module, or a class name in capitals)
        if opts and "=" not in opts[0] and ("." in name or opts[0][:1].isupper()):
            name = f"{name}:{opts.pop(0)}"
        options = {}
        for opt in opts:
            key, sep, value = opt.partition("=")
            if not sep:
                raise ValueError(f"mixer option {opt!r} in {item!r} is not key=value")
            try:
                options[key] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                options[key] = value
        out.append((name, options))
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    return str(v)


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A fixed-width text table of ``columns`` of ``rows``."""
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def emit_points(records: list[dict], table: list[str], out: Path | None, command: str | None = None) -> None:
    """A benchmark's records as one row per point (the run's fields, then the point's, then
    the command that made them when given): printed as a table, written to ``out`` as CSV."""
    rows = [{**{k: v for k, v in r.items() if k != "points"}, **pt, **({"command": command} if command else {})}
            for r in records for pt in r["points"]]
    print()
    print(format_table(rows, table))
    if out:
        write_csv(rows, out)
