"""The single-run tools under ``linbench``: one task, a benchmark, the mixer table, the GPU
check. Each is its module's own command line, reached by a verb here; the ``python -m``
forms run the same ``main`` and stay as aliases.

    linbench task mqar --set seq_len=128           # python -m tasks mqar ...
    linbench task wikitext2-paper --mixer grassmann # python -m tasks.wikitext2 ...
    linbench task snli-paper --head grassmann       # python -m tasks.snli ...
    linbench task mqar-recipe --mixers attention    # python -m tasks.mqar ...
    linbench bench decode --mixers attention,gla    # python -m tasks.benchmarks.decode ...
    linbench bench step-forms --mixers mamba        # python -m tasks.benchmarks.step_forms ...
    linbench mixers --d-model 256                   # python -m zoo ...
    linbench gpu-check --out gpu-check              # python -m tasks.benchmarks.gpu_check ...
"""
from __future__ import annotations

import importlib
import sys

# verb -> {name: (module whose main(argv) it runs, what it does)}; a single tool has name None
TOOLS = {
    "task": {None: ("tasks.__main__", "one run of a registered task, its config set field by field"),
             "wikitext2-paper": ("tasks.wikitext2", "one Wikitext-2 run from the paper's presets"),
             "snli-paper": ("tasks.snli.task", "one SNLI run, scratch or a head over a frozen encoder"),
             "mqar-recipe": ("tasks.mqar.task", "MQAR runs of several mixers on the local recipe")},
    "bench": {"scaling": ("tasks.benchmarks.scaling", "forward and backward time and memory against L"),
              "decode": ("tasks.benchmarks.decode", "time per generated token against the context"),
              "trainstep": ("tasks.benchmarks.trainstep", "a training step's time against attention's"),
              "chunk-sizes": ("tasks.benchmarks.chunk_sizes", "each chunked op's time per chunk size"),
              "step-forms": ("tasks.benchmarks.step_forms", "a decode step's forms timed side by side")},
    "mixers": {None: ("zoo.__main__", "the mixer table and which fast-path kernels run here")},
    "gpu-check": {None: ("tasks.benchmarks.gpu_check", "the device check: CUDA tests, parity, benchmarks")},
}


def add_tool_verbs(verbs) -> None:
    """List the verbs of TOOLS on ``verbs`` (an argparse subparsers object). ``linbench``
    hands a tool's words to it untouched (``run_tool``), so ``--help`` after the verb is the
    tool's own."""
    for verb, tools in TOOLS.items():
        if verb == "task":
            summary = "one run of a task: linbench task NAME --set FIELD=VALUE, or " + ", ".join(
                name for name in tools if name)
        elif None in tools:
            summary = tools[None][1]
        else:
            summary = "a benchmark: " + ", ".join(tools)
        verbs.add_parser(verb, help=summary)  # listed in linbench --help; main() hands the words over


def run_tool(verb: str, argv: list[str]) -> int:
    """Run ``verb``'s tool on ``argv`` (for "bench", argv[0] names the benchmark; for "task"
    a first word naming one of its own command lines picks it, anything else is a task
    for the generic one)."""
    tools = TOOLS[verb]
    name = argv[0] if argv and argv[0] in tools else None
    if name is None and None not in tools:
        choices = ", ".join(tools)
        print(f"linbench {verb}: name one of {choices}, e.g. linbench {verb} {next(iter(tools))} --help")
        return 2
    module = importlib.import_module(tools[name][0])
    # argparse names the program after argv[0]: the usage line then shows the words typed
    argv0, sys.argv[0] = sys.argv[0], " ".join(["linbench", verb, *([name] if name else [])])
    try:
        result = module.main(argv[1:] if name is not None else argv)
    finally:
        sys.argv[0] = argv0
    return result if isinstance(result, int) else 0
