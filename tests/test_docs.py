"""Every relative link and image in README.md and docs/ resolves: to a file or folder of
the repository, and an anchor to a heading of the page it names."""
from __future__ import annotations

import re
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
