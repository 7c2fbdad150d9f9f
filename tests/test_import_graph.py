"""The import graph: no circles, and no import from a lower layer to a higher one.

Every import counts: module level, inside functions (lazy), and under
``TYPE_CHECKING``. The graph is read from the source (no module is imported).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("realtime_engine", "gateway", "bench")

# Lowest first. A module belongs to the layer of its longest matching prefix
# and may import only its own layer or lower ones.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("realtime_engine.format", "realtime_engine.errors", "realtime_engine.logs"),
    ("realtime_engine.text", "realtime_engine.audio"),
    ("realtime_engine.codec",),
    ("realtime_engine.model",),
    ("realtime_engine.talker",),
    ("realtime_engine.engines",),
    ("realtime_engine.tools", "realtime_engine"),
    ("gateway.protocol",),
    ("gateway.client",),
    ("gateway",),  # settings, auth, metrics, state, voices, web_demo
    ("gateway.realtime", "gateway.http"),
    ("gateway.app", "gateway.serving", "gateway.workers", "gateway.cli", "gateway.entry"),
    ("bench",),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imported(path: Path, name: str, known: dict[str, Path]) -> Iterator[str]:
    """Project modules that ``name`` (at ``path``) imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # ``from pkg import sub`` imports the submodule pkg.sub
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def import_graph() -> dict[str, set[str]]:
    known = project_modules()
    return {name: set(imported(path, name, known)) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer(name: str) -> int:
    best, rank = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            matches = name == prefix or name.startswith(prefix + ".")
            # flat gateway.protocol_* modules belong to the protocol layer too
            matches = matches or (prefix == "gateway.protocol" and name.startswith(prefix + "_"))
            if matches and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank >= 0, f"{name} is in no layer"
    return rank


def test_the_graph_is_read_from_real_imports() -> None:
    graph = import_graph()
    assert "realtime_engine.format" in graph["realtime_engine.codec.streaming"]
    assert "gateway.client.connection" in graph["gateway.client.handshake"]


def test_no_import_circles() -> None:
    assert cycles(import_graph()) == []


def test_cycles_are_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    upward = sorted(
        f"{a} -> {b}"
        for a, targets in import_graph().items()
        for b in targets
        if layer(b) > layer(a)
    )
    assert upward == []


def test_the_client_sdk_imports_only_the_protocol_and_the_format() -> None:
    graph = import_graph()
    reached: set[str] = set()
    todo = ["gateway.client", "gateway.client.sync"]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(graph[name])
    outside = {
        n
        for n in reached
        if not n.startswith(("gateway.client", "gateway.protocol", "realtime_engine.format"))
    }
    # the package roots and the frame header's error type are import-free
    assert outside <= {
        "gateway",
        "gateway.protocol.frame_header",
        "realtime_engine.audio.errors",
    }
