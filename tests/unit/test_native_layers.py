"""The native module's files call each other in one direction only: read from the C source
(embedtriton/native/_native/*.c), every call of (or reference to) a function that another
file defines is an edge between the two files, and the edges form no cycle, so each stage
of a call has one owner below the stages that use it (the file list and the order are at
the top of common.h). Each file includes only the headers it uses, of files not above it;
files and functions stay short enough to read (both native modules). Nothing is compiled
or run."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from cycles import cycles_in

NATIVE = Path(__file__).resolve().parents[2] / "embedtriton" / "native" / "_native"
H2 = NATIVE.parent / "_h2"

COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])+\'')
# A function defined at file scope and not static: "type name(params)" with its body next.
DEFINITION = re.compile(r"^(?!static\b|typedef\b|extern\b)[A-Za-z_][\w \t\*]*?\b(\w+)\s*\([^;{]*\)\s*\{", re.M)


def source(path: Path) -> str:
    return STRING.sub('""', COMMENT.sub(" ", path.read_text()))


def files() -> dict[str, str]:
    return {p.name: source(p) for p in sorted([*NATIVE.glob("*.c"), *NATIVE.glob("*.cc")])}


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
    assert "call_bind_request" in edges["kserve.c"]["complete.c"]
    assert "request_add_inputs" in edges["many.c"]["request.c"]
    assert "py_submit" in edges["module.c"]["submit.c"]  # the function table: a reference, not a call
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


# ---- headers: one per concept, owned by the files that define what it declares --------------

# header -> the files that define what it declares (the table at the top of common.h)
OWNERS = {
    "common.h": {"api.c", "convert.c"},
    "graveyard.h": {"graveyard.c"},
    "threads.h": {"threads.c"},
    "trace.h": {"trace.c"},
    "cuda.h": {"cuda.c"},
    "device_array.h": {"device_array.c"},
    "request.h": {"request.c"},
    "calls.h": {"calls.c"},
    "memory.h": {"memory.c"},
    "outputs.h": {"outputs.c"},
    "servers.h": {"servers.c"},
    "queues.h": {"queues.c"},
    "gates.h": {"gates.c"},
    "cancel.h": {"cancel.c"},
    "streams.h": {"streams.c"},
    "complete.h": {"complete.c"},
    "inputs.h": {"inputs.c"},
    "submit.h": {"submit.c"},
    "request_spec.h": {"request_spec.c"},
    "numtext.h": {"numtext.cc"},
    "many.h": {"many.c"},
    "kserve_pb.h": {"kserve_pb.c"},
    "kserve_json.h": {"kserve_json.c", "kserve_json_write.c"},
    "kserve.h": {"kserve.c"},
    "kserve_grpc.h": {"kserve_grpc.c"},
    "kserve_http.h": {"kserve_http.c"},
    "batch_io.h": {"batch_io.c"},
    "fast_batch.h": {"fast_batch.c"},
    "modes.h": {"modes.c"},
    "backend.h": {"backend.c"},
}

INCLUDE = re.compile(r'^#include "(\w+\.h)"', re.M)


def headers() -> dict[str, str]:
    return {p.name: source(p) for p in sorted(NATIVE.glob("*.h"))}


def top_level_statements(text: str) -> list[str]:
    """A header's declarations, one per statement, with what is inside braces left out (a closing
    brace at file scope ends a statement: a typedef's name or an inline function's end)."""
    out, depth = [], 0
    for ch in re.sub(r"#[^\n]*", " ", text):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                out.append(";")
        elif depth == 0:
            out.append(ch)
    return [s.strip() for s in "".join(out).split(";") if s.strip()]


def declared(text: str) -> tuple[set[str], set[str]]:
    """(every name a header declares: macros, types, enum constants, functions and variables;
    the functions and variables among them, which its owners define)."""
    names = {n for n in re.findall(r"#define\s+(\w+)", text) if not n.startswith("EMBEDTRITON_")}
    names |= set(re.findall(r"\bstruct\s+(\w+)\s*\{", text))
    for body in re.findall(r"\benum\s*\w*\s*\{([^}]*)\}", text):
        names |= set(re.findall(r"(\w+)\s*(?:=[^,]*)?(?:,|$)", body.strip()))
    defined: set[str] = set()
    typedef_next = False
    for st in top_level_statements(text):
        if typedef_next and re.fullmatch(r"\w+", st):
            names.add(st)
            typedef_next = False
            continue
        typedef_next = False
        if re.fullmatch(r"(typedef\s+)?(struct|enum|union)(\s+\w+)?", st):
            typedef_next = st.startswith("typedef")
        elif st.startswith("typedef"):
            names |= set(re.findall(r"(\w+)\s*$", st))
        elif st.startswith("extern"):
            found = set(re.findall(r"(\w+)\s*(?:\[[^\]]*\])?\s*(?:,|$)", st))
            names |= found
            defined |= found
        elif m := re.match(r"(static\s+inline\b)?[^(]*?\b(\w+)\s*\(", st):
            names.add(m.group(2))
            if not m.group(1):
                defined.add(m.group(2))
    return names, defined


def variables(texts: dict[str, str]) -> dict[str, str]:
    """variable defined at file scope and not static -> the file that defines it."""
    found: dict[str, str] = {}
    for name, text in texts.items():
        typedef_next = False
        for st in top_level_statements(text):
            skip = typedef_next or re.match(r"(static|typedef|extern)\b", st) or "(" in st
            typedef_next = bool(re.search(r"\b(struct|enum|union)(\s+\w+)?$", st))  # (its name next)
            if skip or re.fullmatch(r"(struct|enum|union)(\s+\w+)?", st):
                continue
            for declarator in st.split(","):
                if m := re.search(r"(\w+)\s*(?:\[\w*\])?\s*$", declarator.split("=")[0]):
                    found.setdefault(m.group(1), name)
    return found


def below(edges: dict[str, dict[str, set[str]]]) -> dict[str, set[str]]:
    """file -> the files it reaches through calls (those below it)."""
    reach: dict[str, set[str]] = {}

    def walk(name: str) -> set[str]:
        if name not in reach:
            reach[name] = set()
            for target in edges.get(name, ()):
                reach[name] |= {target} | walk(target)
        return reach[name]

    for name in edges:
        walk(name)
    return reach


def test_every_header_has_its_owners():
    assert set(headers()) == set(OWNERS)
    assert set().union(*OWNERS.values()) <= set(files())


def test_a_header_declares_what_its_owners_define():
    """Each function or variable a header declares is defined (not static) by one of the files
    the table names as its owners: the table stays true as code moves."""
    texts = files()
    defined = variables(texts) | definitions(texts)
    wrong = {}
    for header, text in headers().items():
        for name in sorted(declared(text)[1]):
            if defined.get(name) not in OWNERS[header]:
                wrong[f"{header}: {name}"] = defined.get(name)
    assert wrong == {}


def test_headers_are_read():
    names, defined = declared(headers()["calls.h"])
    assert {"Call", "CallOps", "CALL_NATIVE", "KEPT_INLINE", "Group", "call_unref"} <= names
    assert "call_unref" in defined and "Call" not in defined
    assert {"api", "g_bindings", "s_name", "now_ns", "raise_from"} <= declared(headers()["common.h"])[0]
    assert "now_ns" not in declared(headers()["common.h"])[1]  # (static inline: nobody defines it)


def includes(text: str) -> list[str]:
    return [h for h in INCLUDE.findall(text) if h in OWNERS]


def test_a_file_includes_only_headers_of_files_not_above_it():
    """A file includes no header of a file above it (one that calls it, directly or not); a header
    includes none of a file above its owners. Siblings may (kserve_json.c reads kserve_pb.h)."""
    reach = below(graph())
    raw = {p.name: p.read_text() for p in sorted(NATIVE.glob("*.[ch]"))}
    wrong = []
    for name, text in raw.items():
        mine = {name} if name.endswith(".c") else OWNERS[name]
        for header in includes(text):
            for includer in mine:
                above = sorted(o for o in OWNERS[header] if o != includer and includer in reach.get(o, ()))
                if above:
                    wrong.append(f"{name} includes {header}, of {', '.join(above)} above {includer}")
    assert wrong == []


def test_a_file_includes_the_headers_it_uses_and_no_other():
    """Each header a file includes declares something the file uses (its own header aside), and
    each header whose declarations it uses is included by name (common.h comes with any)."""
    hs = {h: declared(t)[0] for h, t in headers().items()}
    wrong = []
    for name, text in files().items():
        used = set(re.findall(r"\b\w+\b", text))
        included = set(includes((NATIVE / name).read_text()))
        own = {h for h, owners in OWNERS.items() if name in owners}
        for header in sorted(included - own):
            if not hs[header] & used:
                wrong.append(f"{name} includes {header} and uses none of it")
        for header in sorted(set(hs) - included - own - {"common.h"}):
            if hs[header] & used:
                wrong.append(f"{name} uses {header} ({', '.join(sorted(hs[header] & used))}) without including it")
    assert wrong == []


def overview() -> str:
    """The comment at the top of common.h, without its " * " margins."""
    text = (NATIVE / "common.h").read_text()
    head = text[: text.index("*/")]
    return "\n".join(line[3:] if line.startswith(" * ") else line.lstrip(" */") for line in head.splitlines())


def test_common_h_tells_the_files_the_calls_and_the_headers():
    """The overview at the top of common.h stays true: every file in its list, each file's calls
    as the graph has them (convert.c aside, used by most; module.c aside, which refers to every
    py_*), each header with its owners."""
    text = overview()
    listed = set(re.findall(r"^  (\w+\.cc?)\s", text, re.M))
    assert listed == {p.name for p in NATIVE.iterdir() if p.suffix in {".c", ".cc"}}
    calls = text[text.index("Who calls whom") : text.index("A lower file reaches")]
    told = {
        m.group(1): {f for f in re.split(r"[,\s]+", m.group(2)) if f.endswith((".c", ".cc"))}
        for m in re.finditer(r"(\w+\.c)\s+->\s+(.*?)(?=\w+\.c\s+->|\Z)", calls, re.S)
    }
    edges = graph()
    actual = {name: set(used) - {"convert.c"} for name, used in edges.items() if name != "module.c"}
    assert told == {name: used for name, used in actual.items() if used}
    table = text[text.index("Headers:") :]
    owners = {
        m.group(1): set(re.split(r",\s*", m.group(2))) for m in re.finditer(r"^  (\w+\.h)\s+\(([^)]*)\)", table, re.M)
    }
    assert owners == OWNERS


# ---- sizes: files and functions short enough to read ---------------------------------------

MAX_FILE_LINES = 600  # a file has fewer
MAX_FUNCTION_LINES = 100  # a function has fewer, from its signature's first line to its closing brace
# Functions that may be longer: "file: function" -> why it is not split.
LONG_FUNCTIONS: dict[str, str] = {}


def sources() -> list[Path]:
    return sorted(p for d in (NATIVE, H2) for p in d.iterdir() if p.suffix in {".c", ".cc", ".h"})


def functions(text: str) -> dict[str, int]:
    """function -> its length in lines: from the first line of its signature (at column 0; a
    signature's further lines are indented) to its closing brace at column 0. A function's
    opening brace is on a line of its own (.clang-format)."""
    lines = COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text).split("\n")
    found = {}
    for i, line in enumerate(lines):
        if line.rstrip() != "{":
            continue
        start = i - 1
        while start > 0 and lines[start][:1] in {" ", "\t"} and lines[start].strip():
            start -= 1
        end = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("}"))
        name = re.search(r"(\w+)\s*\(", " ".join(lines[start:i]))
        found[name.group(1) if name else lines[start].strip()] = end - start + 1
    return found


def test_functions_are_found():
    found = functions((NATIVE / "calls.c").read_text())
    assert "call_unref" in found and all(n > 2 for n in found.values())
    text = "static int f(int a,\n                 int b)\n{\n  return a;\n}\n"
    assert functions(text) == {"f": 5}


def test_files_are_short():
    long = {
        f"{p.parent.name}/{p.name}": n for p in sources() if (n := len(p.read_text().splitlines())) >= MAX_FILE_LINES
    }
    assert long == {}


def test_functions_are_short():
    long = {}
    for p in sources():
        for name, n in functions(p.read_text()).items():
            key = f"{p.parent.name}/{p.name}: {name}"
            if n >= MAX_FUNCTION_LINES and key not in LONG_FUNCTIONS:
                long[key] = n
    assert long == {}
    present = {f"{p.parent.name}/{p.name}: {name}" for p in sources() for name in functions(p.read_text())}
    assert set(LONG_FUNCTIONS) <= present  # (no stale entries)
