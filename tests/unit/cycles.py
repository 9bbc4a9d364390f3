"""Cycles in a directed graph, for the layering tests (Python imports; calls between the
native module's files)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def cycles_in(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The cycles a depth-first walk meets, each as the path that closes it (first == last)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        path = [*path, name]
        for target in sorted(edges.get(name, ())):
            if state.get(target) == 1:
                found.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, path)
        state[name] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [])
    return found
