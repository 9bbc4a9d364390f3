"""The package's layers: imports point down only, no module imports itself back through others,
and no module grows past its size budget. Read from the source with ``ast`` (every import,
including those inside functions and under ``if TYPE_CHECKING:``: a circle of annotations is
still a circle), so nothing is imported or run."""

from __future__ import annotations

import ast
from pathlib import Path

from cycles import cycles_in

PACKAGE = Path(__file__).resolve().parents[2] / "embedtriton"

# Lower number = lower layer. A module may import its own layer or lower ones.
LAYERS = {
    "embedtriton._native": 0,
    "embedtriton._h2": 0,
    "embedtriton.errors": 0,
    "embedtriton.tensors": 1,
    "embedtriton.tracing": 1,
    "embedtriton.config": 2,
    "embedtriton.triton": 3,
    "embedtriton.backend": 4,
    "embedtriton.core": 5,
    "embedtriton.frontends": 6,
    "embedtriton.server": 7,
    "embedtriton": 8,  # __init__: the public names
    "embedtriton.__main__": 9,
    "embedtriton.pytriton": 9,  # PyTriton's API, on the public one
    "embedtriton.ray": 9,  # Ray Serve replicas, on the public API and the REST routes
    "embedtriton.tuning": 9,  # the tuner: drives a Server from outside, as a user would
    "embedtriton.doctor": 9,  # doctor, install-runtime: reads the installation, imports the native modules
    "embedtriton.openai": 9,  # OpenAI chat/completion/embedding models, bound through the public API
}
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = ["embedtriton", *path.relative_to(PACKAGE).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(name: str) -> int:
    while name not in LAYERS:
        name = name.rpartition(".")[0]
    return LAYERS[name]


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports (``from pkg import submodule`` counts as
    importing the submodule)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("embedtriton"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("embedtriton"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found) | {"embedtriton._native", "embedtriton._h2"}
    return {name: imports(name, path, known) for name, path in found.items()}


def test_the_graph_is_read():
    edges = graph()
    assert "embedtriton.core" in edges["embedtriton.server"]
    assert "embedtriton.frontends.grpc.endpoint" in edges["embedtriton.server"]  # a lazy import, inside a function
    assert "embedtriton.triton.capi" in edges["embedtriton.triton.control"]
    assert "embedtriton._native" in edges["embedtriton.backend.library"]  # a lazy import, inside a function


def test_imports_point_down():
    upward = [
        f"{name} (layer {layer(name)}) imports {target} (layer {layer(target)})"
        for name, targets in graph().items()
        for target in sorted(targets)
        if layer(target) > layer(name)
    ]
    assert upward == []


def test_no_import_cycles():
    assert [" -> ".join(cycle) for cycle in cycles_in(graph())] == []


def test_the_core_knows_no_frontend():
    for name, targets in graph().items():
        if layer(name) <= LAYERS["embedtriton.core"]:
            assert not [t for t in targets if t.startswith("embedtriton.frontends")], name


def test_modules_stay_small():
    big = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert big == {}


def test_the_frontends_never_touch_the_native_module():
    """Frontends get core handles (embedtriton.core.handles), not native capsules or functions:
    neither embedtriton.backend.library nor the native module itself."""
    native = ("embedtriton.backend.library", "embedtriton._native")
    for name, targets in graph().items():
        if name.startswith("embedtriton.frontends"):
            assert not [t for t in targets if t.startswith(native)], name
