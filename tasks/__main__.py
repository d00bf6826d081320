"""Any registered task from the command line, with no CLI of its own: its config's
defaults, overridden field by field (unknown fields are refused with the valid ones).

    python -m tasks mqar --set seq_len=128 --set num_kv_pairs=8 --set model.max_len=128
    python -m tasks wikitext2 --set preset=tiny --out record.json
"""
from __future__ import annotations

import argparse
import sys
import json

from . import TASKS
from .engine.cli import add_run_arguments, config_from_sets, run_from_cli

# the tasks whose runs take more than their config's fields, each with a command line of its own
OWN_CLIS = ("Tasks with a command line of their own: python -m tasks.wikitext2 (the paper's presets), "
            "python -m tasks.snli (scratch, or a head over a frozen encoder), python -m tasks.mqar (several "
            "mixers on the local recipe); under linbench: linbench task wikitext2-paper | snli-paper | mqar-recipe.")
SUMMARY = ("status", "mixer", "accuracy", "best_val_ppl", "test_ppl", "test_accuracy", "steps", "wall_time")


def summary(record: dict) -> str:
    """The record's headline fields, one JSON line (the whole record goes to --out)."""
    return json.dumps({k: record[k] for k in SUMMARY if k in record})


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=OWN_CLIS)
    ap.add_argument("task", choices=sorted(TASKS))
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    config_class, run = TASKS[args.task]
    try:  # a bad --set is one line, not a traceback
        cfg = config_from_sets(config_class, args.set, seed=args.seed)
    except (ValueError, TypeError) as exc:
        ap.error(str(exc))
    return run_from_cli(cfg, args, run, summary)


if __name__ == "__main__":
    sys.argv[0] = "python -m tasks"  # the usage line names the command, not the file
    main()
