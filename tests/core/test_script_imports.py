"""The scripts that run outside pytest (the fuzz driver, tools/, benchmarks/) import only names
embedtriton still has: a rename in the package fails here, not in CI's fuzz session or a
benchmark run weeks later (the fuzz driver once imported a helper the gRPC endpoint had
dropped). Read with ast: nothing of the scripts runs."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*ROOT.glob("tools/*.py"), *ROOT.glob("tests/fuzz/*.py"), *ROOT.glob("benchmarks/*.py")])


def imported(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) of each ``from embedtriton... import name`` in the script."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("embedtriton"):
            found += [(node.module, alias.name, node.lineno) for alias in node.names]
    return found


def test_the_scripts_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in SCRIPTS}
    assert {"tests/fuzz/fuzz.py", "tools/wheels.py", "benchmarks/bench_compare.py"} <= names
    assert any(imported(p) for p in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_script_imports_what_embedtriton_has(script):
    missing = []
    for module, name, line in imported(script):
        try:
            found = importlib.import_module(module)
        except ImportError as exc:
            if exc.name and not exc.name.startswith("embedtriton"):  # an optional extra not installed here
                continue
            missing.append(f"line {line}: {module} ({exc})")
            continue
        if name != "*" and not hasattr(found, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"line {line}: {name} from {module}")
    assert missing == []
