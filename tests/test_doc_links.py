"""The user documentation holds together: no link points nowhere, no page is unreachable.

* Every relative Markdown link in README.md and docs/ (``[text](path#anchor)``) names a
  file of the repository, and its ``#anchor``, if any, is a heading of that page as
  GitHub makes anchors of headings (lower case; characters other than letters, digits,
  spaces, ``-`` and ``_`` dropped; spaces as ``-``; a repeated heading gets ``-1``,
  ``-2`` ...).
* Every page named in the text as ``docs/….md`` exists.
* Every page under docs/ is named by README.md or docs/architecture.md, so a reader
  starting from either reaches it.

Links inside fenced code blocks are not links and are skipped; links with a scheme
(``https:``) are not followed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = (REPO / "README.md", *sorted(DOCS.rglob("*.md")))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
NAMED_PAGE = re.compile(r"(?<![\w./-])(docs/[\w./-]+\.md)")
HEADING = re.compile(r"#{1,6}\s+(.*?)\s*#*\s*$")


def prose_lines(page: Path) -> Iterator[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered from 1."""
    fenced = False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(page):
        match = HEADING.fullmatch(line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def broken_links(page: Path, root: Path = REPO) -> Iterator[str]:
    for number, line in prose_lines(page):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}:{number}: ({target})"
            if not linked.exists():
                yield f"{where} names no file"
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                yield f"{where} names no heading of {linked.relative_to(root)}"
        for named in NAMED_PAGE.findall(line):
            if not (root / named).exists():
                yield f"{page.relative_to(root)}:{number}: {named} does not exist"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_link_of_a_page_leads_somewhere(page: Path) -> None:
    assert list(broken_links(page)) == []


def unreachable(root: Path) -> list[str]:
    """The pages under root/docs that neither root/README.md nor docs/architecture.md names."""
    docs = root / "docs"
    named = set()
    for entry in (root / "README.md", docs / "architecture.md"):
        text = entry.read_text(encoding="utf-8")
        named |= {(root / path).resolve() for path in NAMED_PAGE.findall(text)}
        named |= {(entry.parent / target.partition("#")[0]).resolve()
                  for target in LINK.findall(text) if target.endswith(".md")}
        named |= {(docs / path).resolve()
                  for path in re.findall(r"(?<![\w./-])(design/[\w.-]+\.md)", text)}
    return [str(page.relative_to(root)) for page in sorted(docs.rglob("*.md"))
            if page.resolve() not in named and page.name != "architecture.md"]


def test_every_docs_page_is_reachable_from_the_readme_or_the_architecture_page() -> None:
    assert unreachable(REPO) == []


def test_the_checks_catch_a_broken_link_and_a_missing_heading(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n## Two words\n\n[ok](#two-words) [no](#three-words)\n"
                    "[gone](absent.md) docs/absent.md\n```\n[in code](absent.md)\n```\n",
                    encoding="utf-8")
    assert list(broken_links(page, root=tmp_path)) == [
        "page.md:5: (#three-words) names no heading of page.md",
        "page.md:6: (absent.md) names no file",
        "page.md:6: docs/absent.md does not exist"]


def test_a_page_nothing_names_is_unreachable(tmp_path: Path) -> None:
    (tmp_path / "docs" / "design").mkdir(parents=True)
    (tmp_path / "README.md").write_text("See `docs/a.md`.\n", encoding="utf-8")
    (tmp_path / "docs" / "architecture.md").write_text("[b](design/b.md)\n", encoding="utf-8")
    for name in ("a.md", "design/b.md", "design/c.md", "d.md"):
        (tmp_path / "docs" / name).write_text("# x\n", encoding="utf-8")
    assert unreachable(tmp_path) == ["docs/d.md", "docs/design/c.md"]
