"""The dependency direction drawn in docs/architecture.md holds for every import of every module:
a package imports only from its own row or the rows below it (type-checking imports aside)."""

from __future__ import annotations

import ast
from pathlib import Path

import gieok

SOURCE = Path(gieok.__file__).parent

# Rows of docs/architecture.md, bottom (0) to top.
ROWS: dict[str, int] = {
    "types": 0, "errors": 0, "chain": 0, "config": 0, "data": 0,
    "store": 1, "embed": 1, "index": 1, "text": 1, "llm": 1, "validate": 1, "coordination": 1,
    "layers": 2, "retrieval": 2,
    "memory": 3,
    "agent": 4,
    "runtime": 5,
    "adapters": 6, "server": 6,
    "cli": 7, "cli_conversation": 7, "cli_server": 7, "cli_options": 7, "demo": 7, "bench": 7, "__main__": 7,
    "__init__": 7,  # the package root re-exports the public surface (Memory, Settings, the errors)
}


def _part(relative: Path) -> str:
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def _targets(path: Path) -> list[tuple[int, str]]:
    """(line, top-level part of gieok) of every import of gieok's own modules in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_lines(tree)
    package = path.relative_to(SOURCE).parent.parts
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.lineno in skip:
            continue
        if node.level:
            base = list(package[: len(package) - (node.level - 1)])
            parts = base + (node.module.split(".") if node.module else [])
            names = [alias.name for alias in node.names] if not node.module and not base else []
        elif node.module and node.module.split(".")[0] == "gieok":
            parts, names = node.module.split(".")[1:], []
        else:
            continue
        for target in ([parts[0]] if parts else names):
            out.append((node.lineno, target.removesuffix(".py")))
    return out


def test_every_import_points_down_or_sideways() -> None:
    wrong = []
    for path in sorted(SOURCE.rglob("*.py")):
        relative = path.relative_to(SOURCE)
        source = _part(relative)
        assert source in ROWS, f"{relative}: add its package to ROWS and to docs/architecture.md"
        for line, target in _targets(path):
            if target in ROWS and ROWS[target] > ROWS[source]:
                wrong.append(f"{relative}:{line} ({source}, row {ROWS[source]}) imports {target} (row {ROWS[target]})")
    assert not wrong, "imports against the dependency direction:\n" + "\n".join(wrong)


def test_the_diagram_names_every_package() -> None:
    diagram = (SOURCE.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    for name in ROWS:
        if name not in ("__init__", "__main__", "cli_conversation", "cli_server", "cli_options"):
            assert name in diagram, f"docs/architecture.md does not show {name}"
