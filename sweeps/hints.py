"""The commands linbench prints for its user to copy.

A printed command is only a help if, pasted as is in the directory it was printed in, it
does what the message says. So each keeps the sweep as the user named it (a shipped name,
or the path as typed), the results folder when ``--results-dir`` was given (without it the
same search finds the same folder again), and a ``linbench run`` keeps the executor and
options it was launched with and the runs it is about (``--only``).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Hints:
    sweep: str  # as typed: "smoke" or "sweeps/mine.py"
    results_dir: str | None = None  # as given with --results-dir; None: found by the same search
    run_options: tuple[str, ...] = ()  # `linbench run`'s executor and options, as launched
    only: tuple[str, ...] = ()  # the --only set it was launched with

    def command(self, verb: str, *rest: str) -> str:
        where = ("--results-dir", self.results_dir) if self.results_dir else ()
        return shlex.join(["linbench", verb, self.sweep, *rest, *where])

    def rerun(self, run_ids=None, options=None) -> str:
        """``linbench run`` as launched (or with ``options``), for ``run_ids`` (default:
        the --only set it was launched with, if any)."""
        keys = self.only if run_ids is None else run_ids
        return self.command("run", *(self.run_options if options is None else options),
                            *(a for key in keys for a in ("--only", key)))
