"""The README is a front door and the manual lives in docs/: every relative link in README.md,
ARCHITECTURE.md and docs/*.md must resolve to a file of the repository, and a link with an
anchor (`page.md#heading`, or `#heading` within the page) must name a heading of that page, as
GitHub makes anchors from headings. External links (http, https, mailto) are not followed.
The README stays short: at most 200 lines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 200

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target); the text may hold brackets one level deep (an image in a link).
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.+?)\s*#*\s*$")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)  # http:, https:, mailto: ...


def documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]


def _outside_fences(text: str):
    """(line number, line) of the lines outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield number, line


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: markup dropped, lower case, punctuation removed,
    spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in _outside_fences(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        base = github_anchor(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link in the prose of a markdown file (not in code)."""
    return [
        (number, m.group(1))
        for number, line in _outside_fences(path.read_text(encoding="utf-8"))
        for m in LINK.finditer(INLINE_CODE.sub("", line))
    ]


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Every relative link of `path` that names no file of `root`, or a heading its page lacks."""
    problems = []
    for number, target in links(path):
        if EXTERNAL.match(target):
            continue
        where = f"{path.relative_to(root)}:{number}: {target}"
        file_part, _, anchor = target.partition("#")
        dest = path if not file_part else (path.parent / file_part).resolve()
        try:
            dest.relative_to(root.resolve())
        except ValueError:
            problems.append(f"{where}: points outside the repository")
            continue
        if not dest.exists():
            problems.append(f"{where}: no such file")
            continue
        if anchor and dest.suffix == ".md" and dest.is_file() and anchor not in anchors(dest):
            problems.append(f"{where}: no heading with anchor #{anchor} in {dest.name}")
    return problems


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    assert doc.is_file(), f"{doc} is missing"
    assert broken_links(doc) == []


def test_the_docs_pages_are_linked_from_the_readme_and_architecture():
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages, "docs/ has no pages"
    for doc in (ROOT / "README.md", ROOT / "ARCHITECTURE.md"):
        linked = {Path(t.partition("#")[0]).name for _, t in links(doc) if t.startswith("docs/")}
        assert pages <= linked, f"{doc.name} does not link {sorted(pages - linked)}"


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most 200)"


def test_ci_runs_the_readme_test_command():
    """.ci/run runs the README's test command: the README must say it and name CI."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^make test\b.*what CI runs", readme, re.MULTILINE)


def test_the_checker_finds_a_broken_link_and_a_missing_anchor(tmp_path):
    """The check can fail: a page with a dead link, a dead anchor and a good one."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## `make run`: the stack\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Title\n\n"
        "[fine](docs/a.md#make-run-the-stack) [self](#title) [web](https://example.com)\n"
        "[gone](docs/missing.md) [no heading](docs/a.md#nowhere)\n"
        "`[in code](docs/ignored.md)`\n\n"
        "```\n[fenced](docs/ignored.md)\n```\n"
    )
    problems = broken_links(page, root=tmp_path)
    assert len(problems) == 2, problems
    assert "docs/missing.md: no such file" in problems[0]
    assert "#nowhere" in problems[1]
