"""The repository explains itself: no text cites a document it does not hold.

Comments and docs point to ``docs/<page>.md#<anchor>``, the README or SECURITY.md.
Four rules: nothing in the tree cites the outside notes the project began from (the
numbered source documents, or the product specification by its short name); every
``docs/<page>.md#<anchor>`` (or ``README.md#``, ``SECURITY.md#``) reference anywhere in
the tree resolves to a heading of that page; every relative link of the Markdown
pages (README.md, SECURITY.md, docs/*.md, deploy/README.md) resolves to a file, and its
``#anchor`` to a heading there; and every module a page names (```storage/journal.py```,
a path of the package, of ``service/`` or of the repository) is there. So moving a
section, renaming a heading or splitting a module cannot leave a link, a comment or the
code map pointing nowhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
SCANNED_DIRS = ("service", "tests", "fixtures", "bench", "deploy", "docs", ".ci")
SCANNED_FILES = ("README.md", "SECURITY.md", "Makefile", "pyproject.toml")
# Generated or installed trees: not the project's own text (an egg-info copies an old
# README, a build tree copies the package).
SKIPPED_DIRS = frozenset(
    {"__pycache__", ".venv", ".mypy_cache", ".ruff_cache", ".pytest_cache", "build", "dist"}
)

# The outside notes by their numbers, and a cited section of the specification, in any
# case; the specification's short name only as a word of its own in capitals (ProviderSpec,
# SPEC_KEYS, UNSPECIFIED and a variable called spec are code names, not citations).
# The character classes keep these patterns from matching their own source text.
NUMBERED_NOTE = re.compile(r"seed[-_ ]?0{2}\d|spec\s+section", re.IGNORECASE)
SHORT_NAME = re.compile(r"(?<![A-Za-z0-9_])S[P]EC(?![A-Za-z0-9_])")
REFERENCE = re.compile(r"((?<![\w/.-])(?:docs/[a-z_-]+|README|SECURITY)\.md)#([A-Za-z0-9_-]+)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PAGES = ("README.md", "SECURITY.md", "docs/*.md", "deploy/README.md")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def citations(text: str) -> list[str]:
    """Every citation of an outside document in ``text``, as written."""
    return [m.group(0) for m in (*NUMBERED_NOTE.finditer(text), *SHORT_NAME.finditer(text))]


def slug(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rule)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The anchors of every heading outside code fences; repeats get ``-1``, ``-2``."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def project_files() -> Iterator[Path]:
    for name in SCANNED_FILES:
        path = ROOT / name
        if path.is_file():
            yield path
    for top in SCANNED_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            parts = path.relative_to(ROOT).parts
            if any(p in SKIPPED_DIRS or p.endswith(".egg-info") for p in parts):
                continue
            if path.is_file():
                yield path


def read_text(path: Path) -> str | None:
    """The file as text, or None for a binary file (an image, a compiled file)."""
    data = path.read_bytes()
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@pytest.fixture(scope="module")
def texts() -> dict[Path, str]:
    found = {}
    for path in project_files():
        text = read_text(path)
        if text is not None:
            found[path.relative_to(ROOT)] = text
    return found


def test_the_scan_covers_the_tree(texts: dict[Path, str]) -> None:
    # An empty or misrooted scan would pass every check below.
    assert Path("README.md") in texts and Path("docs/design.md") in texts
    assert Path("service/reconciler/core/states.py") in texts
    assert Path("tests/unit/test_docs_stand_alone.py") in texts
    assert sum(1 for p in texts if p.parts[0] == "service") > 100


def test_no_file_cites_a_document_outside_the_repository(texts: dict[Path, str]) -> None:
    offending = [
        f"{path}:{number}: {line.strip()}"
        for path, text in texts.items()
        for number, line in enumerate(text.splitlines(), start=1)
        if citations(line)
    ]
    assert not offending, (
        "point to docs/design.md#<anchor> or the README, or give the reason in place:\n"
        + "\n".join(offending)
    )


def test_every_page_reference_resolves_to_a_heading(texts: dict[Path, str]) -> None:
    references = [
        (path, page, anchor)
        for path, text in texts.items()
        for page, anchor in REFERENCE.findall(text)
    ]
    assert len(references) >= 20, "the code points to docs/design.md; the scan found no pointers"
    dangling = sorted(
        {
            f"{path}: {page}#{anchor}"
            for path, page, anchor in references
            if not (ROOT / page).is_file()
            or anchor not in anchors((ROOT / page).read_text(encoding="utf-8"))
        }
    )
    assert not dangling, "no such page or heading:\n" + "\n".join(dangling)


def links(markdown: str) -> list[str]:
    """The targets of every link and image outside code fences."""
    found: list[str] = []
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced:
            found += LINK.findall(line)
    return found


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` that lead to no file, or to no heading there."""
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: are not ours to check
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file.read_text())):
            broken.append(f"{target}: no such heading")
    return broken


def test_every_link_of_the_pages_resolves() -> None:
    pages = sorted({p for pattern in PAGES for p in ROOT.glob(pattern)})
    assert {ROOT / "README.md", ROOT / "docs" / "agents.md", DESIGN} <= set(pages)
    found = {str(p.relative_to(ROOT)): links(p.read_text(encoding="utf-8")) for p in pages}
    assert sum(map(len, found.values())) >= 30, "the pages link to each other; none was found"
    broken = [f"{p.relative_to(ROOT)}: {b}" for p in pages for b in broken_links(p)]
    assert not broken, "\n".join(broken)


# A module as a page names it: a path of ``.py`` file in backquotes (``:name`` may follow).
MODULE = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.py)(?::[\w.]+)?`")
MODULE_ROOTS = (ROOT / "service" / "reconciler", ROOT / "service", ROOT)


def missing_modules(page: Path, roots: tuple[Path, ...] = MODULE_ROOTS) -> list[str]:
    """The modules ``page`` names that are in none of ``roots``."""
    named = MODULE.findall(page.read_text(encoding="utf-8"))
    return [name for name in named if not any((root / name).is_file() for root in roots)]


def test_every_module_a_page_names_is_there() -> None:
    pages = sorted({p for pattern in PAGES for p in ROOT.glob(pattern)})
    named = [m for p in pages for m in MODULE.findall(p.read_text(encoding="utf-8"))]
    assert len(named) >= 100, "the code map names modules; the scan found none"
    missing = [f"{p.relative_to(ROOT)}: {m}" for p in pages for m in missing_modules(p)]
    assert not missing, "no such module:\n" + "\n".join(missing)


def test_a_module_that_moved_is_found(tmp_path: Path) -> None:
    (tmp_path / "storage").mkdir()
    (tmp_path / "storage" / "journal.py").write_text("")
    page = tmp_path / "page.md"
    page.write_text("`storage/journal.py`, `storage/journal.py:Journal`, `storage/gone.py`\n")
    assert missing_modules(page, (tmp_path,)) == ["storage/gone.py"]


def test_the_readme_routes_to_every_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    assert len(pages) >= 6
    unlinked = [page for page in pages if f"]({page}" not in readme]
    assert not unlinked, f"the README links to no {unlinked}"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## A heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n[ok](other.md#a-heading) [ok](#page) [web](https://example.com/x#y)\n"
        "[gone](missing.md) [wrong](other.md#nothing) [here](#nowhere)\n"
        "```\n[in code](not-checked.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nothing: no such heading",
        "#nowhere: no such heading",
    ]


# Built from parts, so that this file itself cites nothing.
NAME, NOTE = "S" + "PEC", "seed " + "00"


@pytest.mark.parametrize(
    "text",
    [
        f"the ordering of {NOTE}3",
        f"the {NOTE.title().replace(' ', '-')}1 spine",
        f"({NOTE}2: distinct words)",
        f'Delay precedence ({NAME} "Poller")',
        f"the {NAME}'s example budget",
        f"see {NAME}.md",
        "as the spec" + " section on trust says",
    ],
)
def test_a_citation_is_found(text: str) -> None:
    assert citations(text)


@pytest.mark.parametrize(
    "text",
    [
        "from reconciler.providers.spec import ProviderSpec, WebhookSpec",
        "spec = ctx.spec(op)",
        "SPEC_KEYS = {",
        "SPECS = st.builds(",
        "AddressClass.UNSPECIFIED",
        "random.Random(args.seed)",
        "seed 7; sqlite; 2 replica(s)",
        "deploy/k8s: spec:",
    ],
)
def test_a_code_name_is_not_a_citation(text: str) -> None:
    assert not citations(text)


def test_anchors_follow_the_renderer() -> None:
    lines = ["# Design", "## Read order", "### create_unknown", "```", "# not a heading", "```"]
    lines += ["## Read order", "## `Operation` view: done?"]
    markdown = "\n".join(lines)
    assert anchors(markdown) == {
        "design",
        "read-order",
        "create_unknown",
        "read-order-1",
        "operation-view-done",
    }
