"""The documentation stays true to the code: README is a short front door, every relative
link in README.md and docs/*.md resolves, and each of docs/configuration.md's settings tables
(engine, chat, server) names exactly the fields its ring declares."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from gieok.chat.settings import ChatSettings
from gieok.config import Settings
from gieok.server.settings import ServerSettings

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
    return [README, *sorted(DOCS.rglob("*.md"))]


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


def _settings_tables(path: Path) -> dict[str, set[str]]:
    """The settings named in the first column of each `### <Section>` table, by section."""
    tables: dict[str, set[str]] = {}
    section: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            section = None
        elif line.startswith("### "):
            section = line[4:].split()[0].lower()
        if section is None or not line.startswith("|"):
            continue
        cells = line.strip().strip("|").split("|")
        first = cells[0].strip()
        if first.startswith("setting") or set(first) <= {"-", ":", " "}:
            continue  # the header row and the separator row
        tables.setdefault(section, set()).update(re.findall(r"`([^`]+)`", first))
    return tables


def _own_fields(cls: type, base: type | None) -> set[str]:
    inherited = {f.name for f in dataclasses.fields(base)} if base is not None else set()
    return {f.name for f in dataclasses.fields(cls)} - inherited


def test_each_rings_settings_table_names_exactly_its_settings() -> None:
    tables = _settings_tables(DOCS / "configuration.md")
    rings = {"engine": (Settings, None), "chat": (ChatSettings, Settings), "server": (ServerSettings, ChatSettings)}
    assert set(tables) == set(rings), f"docs/configuration.md has settings tables {sorted(tables)}"
    for section, (cls, base) in rings.items():
        in_code, in_table = _own_fields(cls, base), tables[section]
        assert in_table == in_code, (
            f"docs/configuration.md's {section} table lacks {sorted(in_code - in_table)}; it names "
            f"{sorted(in_table - in_code)}, which are not {cls.__name__}'s own fields")
        assert section == cls.SECTION


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
