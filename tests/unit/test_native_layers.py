"""The native module's files call each other in one direction only: read from the C source
(embedtriton/native/_native/*.c), every call of (or reference to) a function that another
file defines is an edge between the two files, and the edges form no cycle, so each stage
of a call has one owner below the stages that use it (the file list and the order are at
the top of native.h). Nothing is compiled or run."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from cycles import cycles_in

NATIVE = Path(__file__).resolve().parents[2] / "embedtriton" / "native" / "_native"

COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')
# A function defined at file scope and not static: "type name(params)" with its body next.
DEFINITION = re.compile(r"^(?!static\b|typedef\b|extern\b)[A-Za-z_][\w \t\*]*?\b(\w+)\s*\([^;{]*\)\s*\{", re.M)


def source(path: Path) -> str:
    return STRING.sub('""', COMMENT.sub(" ", path.read_text()))


def files() -> dict[str, str]:
    return {p.name: source(p) for p in sorted(NATIVE.glob("*.c"))}


def definitions(texts: dict[str, str]) -> dict[str, str]:
    """function -> the file that defines it."""
    found: dict[str, str] = {}
    for name, text in texts.items():
        for m in DEFINITION.finditer(text):
            if m.group(1) not in {"if", "while", "for", "switch", "return", "PyInit__native"}:
                found.setdefault(m.group(1), name)
    return found


def graph() -> dict[str, dict[str, set[str]]]:
    """file -> {file it uses: the functions it uses there}."""
    texts = files()
    defined = definitions(texts)
    edges: dict[str, dict[str, set[str]]] = {name: {} for name in texts}
    for name, text in texts.items():
        used = set(re.findall(r"\b\w+\b", text))
        for function in used & set(defined):
            if defined[function] != name:
                edges[name].setdefault(defined[function], set()).add(function)
    return edges


def test_the_graph_is_read():
    edges = graph()
    assert "submit_locked" in edges["many.c"]["submit.c"]
    assert "response_cb" in edges["submit.c"]["complete.c"]  # a reference, not a call
    assert "py_submit" in edges["module.c"]["submit.c"]  # the function table
    assert "call_cancel" in edges["streams.c"]["cancel.c"]


def test_no_cycles_between_files():
    edges = graph()
    shown = [
        " -> ".join(f"{a} ({', '.join(sorted(edges[a][b]))})" for a, b in itertools.pairwise(cycle))
        for cycle in cycles_in(edges)
    ]
    assert shown == []


def test_the_kind_of_a_call_is_told_in_one_place():
    """Only complete.c's call_set_kind tells the kinds apart; the other files run the hooks
    it registered (submit.c reads is_async, which call_set_kind sets)."""
    told = {
        name
        for name, text in files().items()
        if re.search(r"\bCALL_(WAIT|LOOP|TARGET|STREAM)\b|\bc->kind\b|\bis_stream\b", text)
    }
    assert told == {"complete.c"}


# What the C reads of a binding: PyObject_GetAttr(String), SetAttrString and CallMethod on
# `binding`, `ms->binding` or `((ModelState*)state)->binding`, by string or by an interned name.
ON_BINDING = re.compile(
    r"PyObject_(?:GetAttrString|SetAttrString|CallMethod|GetAttr)\(\s*(?:\(\(ModelState\s*\*\)\s*state\)->|ms->)?"
    r"binding\s*,\s*(?:\"(\w+)\"|(s_\w+))"
)
INTERNED = re.compile(r"INTERN\((s_\w+),\s*\"(\w+)\"\)")


def test_every_attribute_the_c_reads_of_a_binding_is_in_native_model():
    """backend/library.py NativeModel lists what the backend reads of a bound model (mypy checks
    that Binding has it all): a lookup added in C without it there fails here."""
    from embedtriton.backend.library import NativeModel

    raw = {p.name: COMMENT.sub(" ", p.read_text()) for p in sorted(NATIVE.glob("*.c"))}
    interned = {m.group(1): m.group(2) for m in INTERNED.finditer(raw["module.c"])}
    read = set()
    for text in raw.values():
        for m in ON_BINDING.finditer(text):
            read.add(m.group(1) or interned[m.group(2)])
    assert {
        "execute",
        "output_specs",
        "queue_gate",
        "_loaded",
        "fast_batch",
        "warmup_error",
    } <= read  # (the reading works)
    declared = set(NativeModel.__annotations__) | {n for n in vars(NativeModel) if not n.startswith("__")}
    assert read - declared == set()


def test_requests_reach_triton_in_one_place():
    """TRITONSERVER_ServerInferAsync is called by threads.c's hand_over alone, which counts what
    Triton took for linger(): submit.c, many.c, queues.c and kserve.c all go through it."""
    calling = {name for name, text in files().items() if "TRITONSERVER_ServerInferAsync(" in text}
    assert calling == {"threads.c"}
    users = {name for name, text in files().items() if re.search(r"\bhand_over\(", text)}
    assert {"submit.c", "many.c", "queues.c", "kserve.c"} <= users
