"""The folders are the layers: a module imports only its own layer or those below it, and
no two modules import each other (directly or around a loop). Read from the source with
``ast``, so an import inside a function counts as much as one at the top."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("zoo", "tasks", "results", "sweeps")

# Lowest first. A module belongs to the longest prefix that names it.
LAYERS = (
    "zoo.config",         # strict typed configs: everything builds on them
    "zoo.ops",            # kernels and their references
    "zoo.mixers",         # one file per mixer, on the ops
    "zoo",                # the model, parameter matching, causality, FLOPs
    "tasks.engine",       # the training loop, losses, data cache, run fields, CLI plumbing
    "tasks.published",    # the published numbers tasks print beside their own
    "tasks.benchmarks",   # timing, scaling, trainstep, the GPU check
    "tasks",              # the tasks and their registry
    "results",            # records, their on-disk layout, statistics, figures, reports
    "results.paper",      # the verdicts on the paper's claims, from the reference records
    "sweeps",             # sweep specs, jobs, launchers, the linbench CLI
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the four packages; the shipped sweep files are data, not modules."""
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
            if "shipped" not in p.parts}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules that ``name`` imports. ``from pkg import sub`` imports the
    module ``pkg.sub`` when there is one, else (a name defined in it) ``pkg``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.add(sub if sub in known else source)
    return {m for m in out if m in known and m != name}


def layer(name: str) -> int:
    owners = [i for i, prefix in enumerate(LAYERS) if name == prefix or name.startswith(prefix + ".")]
    assert owners, f"{name} is in no layer: add its package to LAYERS"
    return max(owners, key=lambda i: len(LAYERS[i]))


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def upward(graph: dict[str, set[str]]) -> list[str]:
    return [f"{m} ({LAYERS[layer(m)]}) imports {d} ({LAYERS[layer(d)]})"
            for m, deps in sorted(graph.items()) for d in sorted(deps) if layer(d) > layer(m)]


def test_no_module_imports_a_layer_above_its_own(graph):
    assert not upward(graph), "imports that run up the layers:\n" + "\n".join(upward(graph))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_two_modules_import_each_other(graph):
    assert not cycles(graph), f"import cycles: {cycles(graph)}"


def test_the_checks_catch_what_they_are_for():
    """Each check fails on a graph that breaks it."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert upward({"tasks.engine.cache": {"results.records"}, "results.records": set()}) == [
        "tasks.engine.cache (tasks.engine) imports results.records (results)"]
    assert layer("tasks.engine.train") < layer("tasks.mqar.task") < layer("results.stats") \
        < layer("results.paper.headline") < layer("sweeps.cli")
    assert layer("zoo.flops") > layer("zoo.mixers.base") > layer("zoo.ops.ssd")


def test_every_module_is_read(graph):
    """The walk sees the packages' modules and their imports (a broken walk would pass
    the checks above vacuously)."""
    assert {"zoo.model", "tasks.engine.train", "results.records", "sweeps.cli", "tasks.mqar.task"} <= set(graph)
    assert "tasks.engine.train" in graph["tasks.mqar.task"] and "zoo.config" in graph["zoo.model"]
    assert not any("shipped" in m for m in graph)


MAX_FUNCTION_LINES = 60  # a function longer than a screen does several things: split it


def long_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of every function or method in ``source`` over MAX_FUNCTION_LINES,
    its signature, docstring and body counted."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_function_of_the_package_is_longer_than_a_screen():
    found = {f"{path.relative_to(ROOT)}:{name}": n for layer in ("zoo", "tasks", "results", "sweeps")
             for path in sorted((ROOT / layer).rglob("*.py")) for name, n in long_functions(path.read_text())}
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines: {found}"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))  # the check itself: one line too many
    assert long_functions(f"def f():\n{body}\n") == [("f", MAX_FUNCTION_LINES + 1)]
    assert long_functions(f"def f():\n{body[:body.rindex(chr(10))]}\n") == []


def test_every_package_is_found_for_an_install():
    """pyproject.toml finds the packages: a new folder of Python under a layer (say
    tasks/yours/) is installed without a line there; the sweep files and the vocabulary
    travel as package data."""
    import tomllib

    from setuptools import find_namespace_packages
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set(find_namespace_packages(where=str(ROOT), **setup["packages"]["find"]))
    holding_python = {".".join(p.parent.relative_to(ROOT).parts) for layer in ("zoo", "tasks", "results", "sweeps")
                      for p in (ROOT / layer).rglob("*.py")}
    assert found == holding_python - {"sweeps.shipped"}
    assert setup["package-data"]["sweeps"] == ["shipped/*.py"] and "vocab/*.json" in setup["package-data"]["tasks.engine"]
