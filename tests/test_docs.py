"""Every relative link and image in README.md and docs/ resolves: to a file or folder of
the repository, and an anchor to a heading of the page it names. Every command their shell
blocks show still runs, or at least parses, where running it costs more than a test should."""
from __future__ import annotations

import functools
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+\s+(.*?)\s*$", CODE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(CODE.sub("", page.read_text())) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


def test_the_checker_sees_links_and_catches_a_broken_one(tmp_path):
    assert len(PAGES) > 1 and any(links(p) for p in PAGES)
    page = tmp_path / "p.md"
    page.write_text("# A title, here\n[ok](#a-title-here) [bad](#nope) [gone](missing.md) `[code](x)`\n")
    assert links(page) == ["#a-title-here", "#nope", "missing.md"]
    assert anchors(page) == {"a-title-here"}


def test_the_readme_is_an_entry_point():
    """Short, with install and the two commands near the top, and a map to docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    top = "\n".join(lines[:40])
    assert "make demo" in top and "make test" in top and "pip install" in top
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in "\n".join(lines), f"README does not link docs/{page.name}"


# --- the commands the pages show still run ---------------------------------------------
#
# Every `linbench ...` and `python -m MODULE ...` (or `torchrun ... -m`) line of a shell block
# is checked, at a cost fit for every test run:
#   - `linbench status|report|plot|export` on shipped sweeps with committed records run for
#     real, on a copy of those records (results/reference), and must exit 0;
#   - `linbench run` on a shipped sweep runs with --dry-run added (the configs load and validate);
#   - any other `linbench` line (logs, cancel, sample, vet, a placeholder such as my_sweep.py)
#     must parse: its verb and options exist and its values are accepted;
#   - `-m MODULE ARGS` runs as `-m MODULE ARGS --help`, in one child process: the module is
#     there, it accepts the values before --help, and its help names every option the line uses.

EXECUTED = {"status", "report", "plot", "export"}
MODULE_RUNNERS = {"python", "python3", "torchrun"}
SHELL = {"", "bash", "sh", "shell", "console"}
REFERENCE = ROOT / "results" / "reference"


def shell_blocks(page: Path) -> list[str]:
    """The text of each fenced code block of ``page`` in a shell language (or none)."""
    blocks, lang, lines = [], None, []
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, lines = line[3:].strip(), []
            else:
                if lang in SHELL:
                    blocks.append("\n".join(lines))
                lang = None
        elif lang is not None:
            lines.append(line)
    return blocks


def doc_commands(page: Path) -> list[list[str]]:
    """The page's `linbench` and `-m MODULE` commands, as words: continuation lines joined,
    comments and leading VAR=value assignments dropped, `&&` chains split."""
    out = []
    for block in shell_blocks(page):
        for line in block.replace("\\\n", " ").splitlines():
            command = []
            for word in [*shlex.split(line, comments=True), "&&"]:
                if word != "&&":
                    command.append(word)
                    continue
                while command and re.fullmatch(r"[A-Za-z_]\w*=.*", command[0]):
                    command.pop(0)
                if command and (command[0] == "linbench" or (command[0] in MODULE_RUNNERS and "-m" in command)):
                    out.append(command)
                command = []
    return out


COMMANDS = sorted({tuple(c) for page in PAGES for c in doc_commands(page)})


def shipped(name: str) -> bool:
    return (ROOT / "sweeps" / "shipped" / f"{name}.py").is_file()


def test_the_command_reader_reads_continuations_chains_and_comments(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("```bash\nlinbench status smoke && linbench plot smoke   # two\n"
                    "X=1 python -m tasks.wikitext2 --preset tiny \\\n    --out 'a b.json'\nmake demo\n```\n"
                    "```python\nlinbench = 1\n```\ntext\n```\nlinbench run smoke --dry-run\n```\n")
    assert doc_commands(page) == [["linbench", "status", "smoke"], ["linbench", "plot", "smoke"],
                                  ["python", "-m", "tasks.wikitext2", "--preset", "tiny", "--out", "a b.json"],
                                  ["linbench", "run", "smoke", "--dry-run"]]
    verbs = {c[1] for c in COMMANDS if c[0] == "linbench"}
    assert {"run", "status", "report", "plot"} <= verbs  # the pages' own commands are found
    assert any(c[0] != "linbench" for c in COMMANDS)


def test_the_linbench_commands_of_the_pages_run(tmp_path, monkeypatch, capsys):
    from sweeps import cli
    from sweeps.cli import main, parser
    from sweeps.tools import TOOLS

    results = tmp_path / "results"
    monkeypatch.chdir(tmp_path)  # a relative --out lands here, not in the checkout
    monkeypatch.setattr(cli, "load_sweep", functools.cache(cli.load_sweep))  # each sweep built once
    ran = []
    for command in (c for c in COMMANDS if c[0] == "linbench"):
        argv = list(command[1:])
        verb = argv[0]
        if verb in TOOLS:  # a tool's own command line: its --help must know every option the page uses
            with pytest.raises(SystemExit) as done:
                main([*argv, "--help"])
            text = capsys.readouterr().out
            unknown = sorted({w.split("=")[0] for w in argv if w.startswith("--")} - {"--help"})
            unknown = [option for option in unknown if not re.search(rf"{re.escape(option)}\b", text)]
            assert done.value.code == 0 and not unknown, f"{' '.join(command)}: options not in its help {unknown}"
            ran.append(verb)
            continue
        # the sweeps it reads: `plot` takes more after the first, up to its options
        sweeps = [argv[1], *(itertools.takewhile(lambda w: not w.startswith("-"), argv[2:]) if verb == "plot" else ())]
        try:
            parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{' '.join(command)}: does not parse ({capsys.readouterr().err.strip()})")
        if verb == "run" and shipped(argv[1]):
            argv.append("--dry-run")
        elif not (verb in EXECUTED and all(shipped(s) and (REFERENCE / s).is_dir() for s in sweeps)):
            continue
        for sweep in sweeps:
            if (REFERENCE / sweep).is_dir() and not (results / sweep).is_dir():
                (results / sweep).mkdir(parents=True)
                for record in (REFERENCE / sweep).glob("*.json"):
                    shutil.copy(record, results / sweep)
        code = main([*argv, "--results-dir", str(results)])
        out = capsys.readouterr()
        assert code == 0, f"{' '.join(command)}: exit {code}\n{out.err[-2000:]}"
        ran.append(verb)
    assert {"run", "status", "report", "plot", "bench"} <= set(ran)


# runs each [module, *args] as `python -m` would, and prints [[exit code, output], ...]
HELP_CHILD = """
import contextlib, io, json, runpy, sys
said = []
for argv in json.loads(sys.argv[1]):
    sys.argv, out, code = list(argv), io.StringIO(), "returned without exiting"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code
    said.append([code, out.getvalue()])
print("\\n" + json.dumps(said))
"""


def test_the_module_commands_of_the_pages_parse(tmp_path):
    commands = [c for c in COMMANDS if c[0] in MODULE_RUNNERS]
    runs = [[c[c.index("-m") + 1], *c[c.index("-m") + 2:], "--help"] for c in commands]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    # in a scratch folder: a module that ignored --help would write its --out there, not over a reference file
    done = subprocess.run([sys.executable, "-c", HELP_CHILD, json.dumps(runs)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().rsplit("\n", 1)[-1])
    for command, run, (code, text) in zip(commands, runs, said):
        used = {word.split("=")[0] for word in run[1:-1] if word.startswith("--")}
        unknown = sorted(option for option in used if not re.search(rf"{re.escape(option)}\b", text))
        assert code == 0 and not unknown, (f"{' '.join(command)}: exit {code}, options not in its help {unknown}\n"
                                           f"{text[-2000:]}")
    assert len(runs) >= 5
