"""The documentation stays true to the code: README is a short front door, every relative
link in README.md and docs/*.md resolves, and docs/configuration.md's settings table names
exactly the fields of `gieok.config.Settings`."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from gieok.config import Settings

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

QUICKSTART = (
    "python3 -m venv .venv && .venv/bin/pip install -q -r requirements.lock -e . && .venv/bin/gieok demo",
    "python3 -m venv .venv && .venv/bin/pip install -q -r requirements-dev.lock -e . && .venv/bin/python -m pytest -q",
)

# [text](target) or [text](target "title"); the target is group 1.
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~)")


def _doc_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose(path: Path) -> str:
    """The file without code blocks and inline code (code may contain brackets that are not links)."""
    lines, in_fence = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(lines)


def _relative_links(path: Path) -> list[str]:
    targets = []
    for target in _LINK.findall(_prose(path)):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        targets.append(target)
    return targets


def _settings_table_names(path: Path) -> set[str]:
    names: set[str] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        cells = line.strip().strip("|").split("|")
        first = cells[0].strip()
        if first.startswith("setting") or set(first) <= {"-", ":", " "}:
            continue  # the header row and the separator row
        names.update(re.findall(r"`([^`]+)`", first))
    return names


def test_configuration_table_names_every_setting() -> None:
    in_table = _settings_table_names(DOCS / "configuration.md")
    in_code = {field.name for field in dataclasses.fields(Settings)}
    missing_from_table = sorted(in_code - in_table)
    not_settings = sorted(in_table - in_code)
    assert in_table == in_code, (
        f"docs/configuration.md's settings table lacks {missing_from_table}; "
        f"it names {not_settings}, which are not fields of Settings"
    )


def test_docs_links_resolve() -> None:
    broken = []
    for path in _doc_files():
        for target in _relative_links(path):
            file_part = target.split("#", 1)[0]
            if not (path.parent / file_part).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_readme_is_a_front_door() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the limit is 250 (depth goes to docs/)"
    for command in QUICKSTART:
        assert command in lines, f"README.md lacks the quickstart command, verbatim: {command}"
    linked = {(README.parent / target.split("#", 1)[0]).resolve() for target in _relative_links(README)}
    pages = sorted(p for p in DOCS.iterdir() if p.is_file())
    assert pages, "docs/ has no pages"
    unlinked = [p.name for p in pages if p.resolve() not in linked]
    assert not unlinked, f"README.md does not link these docs pages: {unlinked}"
