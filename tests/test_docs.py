"""The code the documentation shows works: every ```python block of README.md and docs/*.md is
marked, on the line before it, with how the tests check it.

- ``<!-- test: run -->``: run as a script (in a folder of its own); a ``print(...)  # text``
  line's text must be in what it prints.
- a block that only includes a file (``--8<-- "examples/x.py"``, the site's snippet include)
  shows an example that tests/test_examples.py runs.
- ``<!-- test: not run: why -->``: compiled, and the names it imports from embedtriton must
  exist (where their module imports here).
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
_FENCE = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
_INCLUDE = re.compile(r'^--8<-- "([^"]+)"$')


def _blocks() -> list[tuple[str, str, str]]:
    """(where, marker, code) of every python block."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in _FENCE.finditer(text):
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            line = text[: match.start()].count("\n") + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", before, match.group(1)))
    return found


BLOCKS = _blocks()


def _kind(marker: str, code: str) -> str:
    if all(_INCLUDE.match(line) for line in code.strip().splitlines()):
        return "include"
    if marker == "<!-- test: run -->":
        return "run"
    if marker.startswith("<!-- test: not run: ") and marker.endswith("-->"):
        return "not run"
    return "unmarked"


def test_every_python_block_is_marked():
    unmarked = [where for where, marker, code in BLOCKS if _kind(marker, code) == "unmarked"]
    assert not unmarked, f"python blocks without a <!-- test: ... --> marker: {unmarked}"
    assert any(_kind(m, c) == "run" for _, m, c in BLOCKS)


@pytest.mark.parametrize(
    "where, code",
    [(w, c) for w, m, c in BLOCKS if _kind(m, c) == "run"],
    ids=[w for w, m, c in BLOCKS if _kind(m, c) == "run"],
)
def test_runnable_block_runs(where, code, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{where}:\n{done.stderr}"
    printed = " ".join(done.stdout.split())
    for line in code.splitlines():
        if line.lstrip().startswith("print(") and "  # " in line:
            promised = " ".join(line.split("  # ", 1)[1].split())
            assert promised in printed, f"{where}: {line.strip()!r} printed {done.stdout!r}"


@pytest.mark.parametrize(
    "where, code",
    [(w, c) for w, m, c in BLOCKS if _kind(m, c) == "include"],
    ids=[w for w, m, c in BLOCKS if _kind(m, c) == "include"],
)
def test_included_code_is_a_tested_example(where, code):
    tested = (ROOT / "tests" / "test_examples.py").read_text()
    for line in code.strip().splitlines():
        path = ROOT / _INCLUDE.match(line).group(1)
        assert path.is_file(), f"{where}: {path} does not exist"
        assert path.parent == ROOT / "examples" and f'"{path.name}"' in tested, f"{where}: no test runs {path.name}"


@pytest.mark.parametrize(
    "where, code",
    [(w, c) for w, m, c in BLOCKS if _kind(m, c) == "not run"],
    ids=[w for w, m, c in BLOCKS if _kind(m, c) == "not run"],
)
def test_block_not_run_compiles_and_imports_what_exists(where, code):
    tree = compile(code, where, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "embedtriton":
            try:
                module = importlib.import_module(node.module)
            except ImportError as exc:  # an optional dependency (ray, ...) missing here
                if "embedtriton" in str(exc.name or ""):
                    raise
                continue
            missing = [alias.name for alias in node.names if not hasattr(module, alias.name)]
            assert not missing, f"{where}: {node.module} has no {missing}"
