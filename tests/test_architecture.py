"""The package's shape, as docs/architecture.md draws it, holds for every import of every module.

Three rings and the command line around them:
- the **engine** (`gieok`: types, errors, config, text, embed, store, index, retrieval, the
  engine layers, memory) imports nothing of the chat, the server or the command line;
- the **chat** (`gieok.chat`: the conversation layers, the agent, the models, the runtime, the
  adapters and the one composition root) imports the engine, never the server;
- the **server** (`gieok.server`) imports the engine and the chat;
- the **command line** (`gieok.cli`) may import all three, and is the only place that reaches for
  the benchmarks (which live outside the package).

Every import counts here — at the top of a module, inside a function, or under `TYPE_CHECKING`:
a type-only import from the engine into the chat is still the engine knowing the chat. Inside the
engine and inside the chat, packages keep their rows: each imports only its own row or rows below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gieok

SOURCE = Path(gieok.__file__).parent
REPO = SOURCE.parents[1]

RINGS = {"engine": 0, "chat": 1, "server": 2, "cli": 3}

# Rows inside the engine (docs/architecture.md), bottom (0) to top.
ENGINE_ROWS: dict[str, int] = {
    "types": 0, "errors": 0, "chain": 0, "callbacks": 0, "config": 0, "data": 0,
    "store": 1, "embed": 1, "index": 1, "text": 1, "validate": 1, "coordination": 1,
    "layers": 2, "retrieval": 2,
    "memory": 3, "client": 4,  # the client (gieok.client) stands on the types and errors, as a program using them would
    "__init__": 4,  # the package root re-exports the public surface (Memory, Settings, the errors)
    "integrations": 5,  # adapters for agent frameworks (gieok.integrations.*): each stands on the client alone
}
# Rows inside the chat, bottom (0) to top.
CHAT_ROWS: dict[str, int] = {
    "settings": 0, "data": 0, "lazy_members": 0,
    "llm": 1, "conversation": 1,
    "agent": 2,
    "runtime": 3,
    "compose": 4,  # the one composition root: the adapters and everything outside the chat build bots with it
    "adapters": 5, "demo": 5,
    "__init__": 6,
}


def _ring_and_row(relative: Path) -> tuple[str, str]:
    """(ring, the package or module naming its row) of a file or dotted path under gieok/."""
    parts = relative.with_suffix("").parts if relative.suffix else relative.parts
    head = parts[0]
    if head in ("chat", "server", "cli") and len(parts) > 1:
        return head, parts[1]
    if head in ("chat", "server", "cli"):
        return head, "__init__"
    return "engine", head


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module under gieok, or 'benchmarks…') of every import in `path`, wherever it
    stands: module level, inside functions, under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ["gieok", *path.relative_to(SOURCE).parent.parts]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
                names = [f"{module}.{alias.name}" for alias in node.names] if not node.module else [module]
            else:
                names = [node.module or ""]
            found.extend((node.lineno, name) for name in names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, name) for line, name in found
            if name == "gieok" or name.startswith(("gieok.", "benchmarks"))]


def _target(dotted: str) -> tuple[str, str] | None:
    if dotted.startswith("benchmarks"):
        return None
    parts = dotted.split(".")[1:]
    if not parts:
        return "engine", "__init__"
    return _ring_and_row(Path(*parts))


def _sources() -> list[Path]:
    return sorted(SOURCE.rglob("*.py"))


def test_the_rings_point_inwards_only() -> None:
    wrong = []
    for path in _sources():
        relative = path.relative_to(SOURCE)
        ring, _ = _ring_and_row(relative)
        for line, dotted in _imports(path):
            if dotted.startswith("benchmarks"):
                if ring != "cli":
                    wrong.append(f"{relative}:{line} ({ring}) imports {dotted}: only the command line reaches "
                                 "for the benchmarks")
                continue
            target = _target(dotted)
            assert target is not None
            if RINGS[target[0]] > RINGS[ring]:
                wrong.append(f"{relative}:{line} ({ring}) imports {dotted} ({target[0]})")
    assert not wrong, "imports that point out of a ring:\n" + "\n".join(wrong)


def test_rows_inside_the_engine_and_the_chat_point_down_or_sideways() -> None:
    wrong = []
    for path in _sources():
        relative = path.relative_to(SOURCE)
        ring, row = _ring_and_row(relative)
        rows = {"engine": ENGINE_ROWS, "chat": CHAT_ROWS}.get(ring)
        if rows is None:
            continue
        assert row in rows, f"{relative}: add {row} to the {ring} rows here and to docs/architecture.md"
        for line, dotted in _imports(path):
            target = _target(dotted)
            if target is None or target[0] != ring or target[1] not in rows:
                continue
            if rows[target[1]] > rows[row]:
                wrong.append(f"{relative}:{line} ({ring} {row}, row {rows[row]}) imports {dotted} "
                             f"(row {rows[target[1]]})")
    assert not wrong, "imports against the dependency direction:\n" + "\n".join(wrong)


def test_no_memory_is_typed_any() -> None:
    """A `memory` parameter or attribute typed `Any` hides which ring it comes from."""
    wrong = []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            annotated: list[tuple[str, ast.expr | None, int]] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                annotated += [(a.arg, a.annotation, node.lineno) for a in args]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, (ast.Name, ast.Attribute)):
                name = node.target.id if isinstance(node.target, ast.Name) else node.target.attr
                annotated.append((name, node.annotation, node.lineno))
            for name, annotation, line in annotated:
                if name == "memory" and annotation is not None and "Any" in ast.unparse(annotation):
                    wrong.append(f"{path.relative_to(SOURCE)}:{line} {name}: {ast.unparse(annotation)}")
    assert not wrong, "memory typed Any:\n" + "\n".join(wrong)


def test_the_memory_facade_stays_a_facade() -> None:
    """`Memory` wires its parts (memory/: indexes, layers, search, writes, transfer, events) and
    checks what callers give it; the work is in the parts. 400 lines is the line it keeps under."""
    lines = (SOURCE / "memory" / "facade.py").read_text(encoding="utf-8").count("\n")
    assert lines <= 400, f"memory/facade.py has {lines} lines: move the work into a part of memory/"


def test_the_bot_is_wired_in_one_place() -> None:
    """The chain Memory → model → pipeline → bot core is built by `gieok.chat.compose` alone:
    Discord, the terminal chat, the server and the benchmarks all ask it."""
    wiring = ("ConversationPipeline(", "BotCore(", "create_llm(")
    wrong = []
    for path in [*_sources(), *sorted((REPO / "benchmarks").rglob("*.py"))]:
        if path == SOURCE / "chat" / "compose.py" or path.parent.name == "llm":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            code = line.split("#")[0]
            if any(call in code for call in wiring) and not code.lstrip().startswith(("class ", "def ")):
                wrong.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not wrong, "the bot wired outside gieok.chat.compose:\n" + "\n".join(wrong)


def test_the_diagram_names_every_package() -> None:
    diagram = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    for name in [*ENGINE_ROWS, *CHAT_ROWS]:
        if name != "__init__":
            assert name in diagram, f"docs/architecture.md does not show {name}"
