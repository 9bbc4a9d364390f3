"""A ratchet on ``Any`` in the public API: count it, fail when the count goes up.

The public API is what DESIGN.md's contract names: the names ``embedtriton`` exports, and those
of ``embedtriton.tuning``, ``embedtriton.openai`` and of the PyTriton-compatible modules. Counted: each occurrence of
``Any`` in the signatures of their functions and of their classes' public methods and properties
(``__init__`` and ``__call__`` included: a dataclass's fields are its ``__init__``'s parameters).
Type aliases count as written (``InferFunc``, not what it stands for).

Run: ``python tools/public_any.py`` (``nox -s lint`` does). When you remove an ``Any``, lower
RECORDED to the new count; when you must add one, prefer a real type.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Iterator
from typing import Any

RECORDED = 107

PUBLIC_MODULES = [
    "embedtriton",
    "embedtriton.tuning",
    "embedtriton.openai",
    "embedtriton.pytriton.triton",
    "embedtriton.pytriton.model_config",
    "embedtriton.pytriton.decorators",
    "embedtriton.pytriton.client",
    "embedtriton.pytriton.exceptions",
]
_ANY = re.compile(r"\bAny\b")


def annotations_of(obj: Any) -> Iterator[tuple[str, object]]:
    """(where, annotation) for each annotation in the signatures of a public function or of a
    class's public methods; ``where`` names the function that declares it, so what two exported
    names share (a base class's method) is counted once."""
    if inspect.isclass(obj):
        for attr in dir(obj):
            if attr.startswith("_") and attr not in ("__init__", "__call__"):
                continue
            member = inspect.getattr_static(obj, attr)
            if isinstance(member, property):
                member = member.fget
            elif isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if inspect.isfunction(member) and member.__module__.startswith("embedtriton"):
                yield from annotations_of_function(member)
    elif inspect.isfunction(obj):
        yield from annotations_of_function(obj)


def annotations_of_function(func: Any) -> Iterator[tuple[str, object]]:
    name = f"{func.__module__}.{func.__qualname__}"
    signature = inspect.signature(func)
    for parameter in signature.parameters.values():
        if parameter.annotation is not inspect.Parameter.empty:
            yield f"{name}({parameter.name})", parameter.annotation
    if signature.return_annotation is not inspect.Signature.empty:
        yield f"{name} ->", signature.return_annotation


def count() -> dict[str, int]:
    """Where ``Any`` occurs in the public API, and how often."""
    found: dict[str, int] = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for export in module.__all__:
            for where, annotation in annotations_of(getattr(module, export)):
                text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
                if _ANY.search(text):
                    found[where] = len(_ANY.findall(text))
    return found


def main() -> int:
    found = count()
    total = sum(found.values())
    if "-v" in sys.argv:
        for where, n in sorted(found.items()):
            print(f"{n:3}  {where}")
    if total > RECORDED:
        print(f"public API: {total} Any in signatures, more than the {RECORDED} recorded in tools/public_any.py;")
        print("give the new ones real types (`python tools/public_any.py -v` lists them)")
        return 1
    if total < RECORDED:
        print(f"public API: {total} Any in signatures, fewer than the {RECORDED} recorded: lower RECORDED to {total}")
        return 1
    print(f"public API: {total} Any in signatures (as recorded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
