"""Relative links in README.md and docs/*.md point at files (and headings) that exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_LINK = re.compile(r"(?<!\\)\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def links(path: Path) -> list[str]:
    """The link targets of a markdown file, outside code blocks."""
    return _LINK.findall(_FENCE.sub("", path.read_text()))


def test_relative_links_resolve() -> None:
    broken = []
    checked = 0
    for path in _files():
        for target in links(path):
            if re.match(r"^[a-z]+:", target) or target.startswith("//"):
                continue                           # http(s), mailto: not checked (no network)
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            checked += 1
            if not dest.exists():
                broken.append(f"{path.relative_to(REPO)}: {target} (no such file)")
                continue
            if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{path.relative_to(REPO)}: {target} (no such heading)")
    assert checked > 20
    assert not broken, "\n".join(broken)


def test_every_doc_is_reachable_from_the_readme() -> None:
    seen: set[Path] = set()
    todo = [REPO / "README.md"]
    while todo:
        path = todo.pop()
        if path in seen or not path.exists():
            continue
        seen.add(path)
        for target in links(path):
            file_part = target.partition("#")[0]
            if file_part.endswith(".md") and not re.match(r"^[a-z]+:", file_part):
                todo.append((path.parent / file_part).resolve())
    docs = set((REPO / "docs").glob("*.md"))
    assert not docs - seen, sorted(str(p.relative_to(REPO)) for p in docs - seen)


def test_the_slug_matches_github() -> None:
    assert _slug("Running a plan: `nanoplan run`") == "running-a-plan-nanoplan-run"
    assert _slug("What is measured and what is assumed") == "what-is-measured-and-what-is-assumed"
