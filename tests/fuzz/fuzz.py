"""Build and run the fuzz targets beside this file: `nox -s fuzz -- --seconds N` (docs/security.md,
"How the parsers are tested"; docs/development.md has the recipes).

Each C target (`<name>.c`, a libFuzzer `LLVMFuzzerTestOneInput`) is linked with the native module
it drives, whose sources are compiled here with clang under libFuzzer's coverage instrumentation,
AddressSanitizer and UndefinedBehaviorSanitizer (every finding fatal), into build/fuzz/. The modules
include Python.h, so the targets link libpython, but none of them starts the interpreter: the
parsers run on their own. `kserve_pb_diff.py` is an atheris target (Python): the gRPC decoder
against the protobuf library.

Every target starts from its seed corpus, tests/fuzz/corpus/<name>/ (committed: recorded requests,
inputs from the hypothesis strategies, and every input that once found a bug), and its dictionary,
tests/fuzz/<dict>.dict. What a run learns goes to build/fuzz/corpus/<name>/, a crash, leak or
sanitizer report to build/fuzz/findings/<name>/ (and the run fails). At the end a table gives each
target's executions, edges covered (libFuzzer's "cov") and time.

    python tests/fuzz/fuzz.py --seconds 15                  # every target, 15 s each (CI)
    python tests/fuzz/fuzz.py --seconds 1200 --runs 10000000 --jobs 2   # a campaign
    python tests/fuzz/fuzz.py --target http1_conn --seconds 60
    python tests/fuzz/fuzz.py --merge                       # fold what runs found into the seeds
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
NATIVE = ROOT / "embedtriton" / "native"
BUILD = ROOT / "build" / "fuzz"
INSTALL = "Debian: apt install clang libclang-rt-14-dev"

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
CFLAGS = ["-g", "-O1", "-fno-omit-frame-pointer", "-Wall", "-Wno-unused-function", *SANITIZE]


@dataclass(frozen=True)
class Target:
    name: str
    module: str  # the native module it links: "_native" or "_h2" ("": a Python target)
    dict: str | None
    max_len: int
    about: str


TARGETS = [
    Target("http1_conn", "_h2", "http1", 16384, "HTTP/1.1 requests through the connection, cut anywhere"),
    Target("h2_session", "_h2", "h2", 16384, "HTTP/2 frames into a gRPC server session"),
    Target("inflate", "_h2", None, 65536, "gzip/deflate request messages; deflate round trip"),
    Target("kserve_json", "_native", "json", 16384, "KServe JSON bodies, with binary tensors"),
    Target("kserve_pb", "_native", "pb", 16384, "ModelInferRequest protobuf"),
    Target("numtext", "_native", "numtext", 400, "numbers as JSON text, written and read"),
    Target("kserve_pb_diff", "", "pb", 4096, "ModelInferRequest: our decoder against protobuf's"),
]


def clang(cxx: bool = False) -> str:
    name = "clang++" if cxx else "clang"
    path = shutil.which(name)
    if path is None:
        sys.exit(f"fuzz: {name} is not installed ({INSTALL})")
    return path


def python_flags() -> tuple[list[str], list[str]]:
    """Include and link flags for libpython (linked, never initialized)."""
    import numpy

    paths = sysconfig.get_paths()
    includes = [f"-I{paths['include']}", f"-I{numpy.get_include()}"]
    libdir = sysconfig.get_config_var("LIBDIR")
    version = sysconfig.get_config_var("LDVERSION") or sysconfig.get_config_var("VERSION")
    return includes, [f"-L{libdir}", f"-Wl,-rpath,{libdir}", f"-lpython{version}"]


def newer(target: Path, sources: list[Path]) -> bool:
    return not target.exists() or any(s.stat().st_mtime > target.stat().st_mtime for s in sources)


def run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"fuzz: build failed: {' '.join(cmd)}\n{done.stdout}{done.stderr}")


def build_module(module: str, includes: list[str]) -> Path:
    """The module's sources, instrumented, as a static archive (compiled in parallel, only what changed)."""
    src = NATIVE / module
    headers = [*src.glob("*.h"), *(NATIVE / "include").glob("*.h")]
    out = BUILD / "obj" / module
    out.mkdir(parents=True, exist_ok=True)
    jobs = []
    for source in sorted([*src.glob("*.c"), *src.glob("*.cc")]):
        obj = out / (source.name + ".o")
        if newer(obj, [source, *headers, Path(__file__)]):
            std = "-std=c++17" if source.suffix == ".cc" else "-std=c11"
            extra = ["-fno-exceptions"] if source.suffix == ".cc" else []
            jobs.append([clang(source.suffix == ".cc"), *CFLAGS, "-fsanitize=fuzzer-no-link", std, *extra,
                         f"-I{NATIVE / 'include'}", f"-I{src}", *includes, "-c", str(source), "-o", str(obj)])  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        list(pool.map(run, jobs))
    archive = BUILD / f"lib{module}.a"
    objects = sorted(out.glob("*.o"))
    if jobs or not archive.exists():
        archive.unlink(missing_ok=True)
        run(["ar", "rcs", str(archive), *map(str, objects)])
    return archive


def build(targets: list[Target]) -> None:
    includes, libpython = python_flags()
    archives = {m: build_module(m, includes) for m in sorted({t.module for t in targets if t.module})}
    for t in targets:
        if not t.module:
            continue
        exe, source, archive = BUILD / t.name, HERE / f"{t.name}.c", archives[t.module]
        if newer(exe, [source, HERE / "fuzz.h", archive, Path(__file__)]):
            obj = BUILD / "obj" / f"{t.name}.o"
            run([clang(), *CFLAGS, "-fsanitize=fuzzer-no-link", "-std=gnu11", f"-I{NATIVE / 'include'}",
                 f"-I{NATIVE / t.module}", f"-I{HERE}", *includes, "-c", str(source), "-o", str(obj)])  # fmt: skip
            run([clang(True), *CFLAGS, "-fsanitize=fuzzer", str(obj), str(archive), *libpython,
                 "-ldl", "-lpthread", "-lz", "-lm", "-o", str(exe)])  # fmt: skip


@functools.cache
def runtime_nghttp2() -> str:
    """The Triton runtime's own libnghttp2, which the h2_session target (as the gRPC transport,
    load_nghttp2) weighs against the system's; "" without the runtime."""
    from embedtriton.triton.runtime import runtime_nghttp2 as bundled

    return bundled() or ""


@dataclass
class Result:
    target: str
    seconds: float
    runs: int
    per_second: int
    edges: int
    features: int
    corpus: int
    ok: bool
    finding: str


STAT = re.compile(r"stat::(\w+):\s+(\d+)")
PROGRESS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)")


def fuzz(t: Target, seconds: int, runs: int, log: Path) -> Result:
    corpus = BUILD / "corpus" / t.name
    findings = BUILD / "findings" / t.name
    corpus.mkdir(parents=True, exist_ok=True)
    findings.mkdir(parents=True, exist_ok=True)
    seeds = HERE / "corpus" / t.name
    flags = [f"-max_total_time={seconds}", f"-max_len={t.max_len}", "-timeout=10", "-rss_limit_mb=2560",
             "-print_final_stats=1", f"-artifact_prefix={findings}/", "-close_fd_mask=0"]  # fmt: skip
    if runs:
        flags.append(f"-runs={runs}")
    if t.dict:
        flags.append(f"-dict={HERE / (t.dict + '.dict')}")
    if t.module:
        cmd = [str(BUILD / t.name), *flags, str(corpus), str(seeds)]
    else:  # atheris: the same flags, given to its libFuzzer
        cmd = [sys.executable, str(HERE / f"{t.name}.py"), *flags, str(corpus), str(seeds)]
    env = dict(os.environ, EMBEDTRITON_FUZZ_NGHTTP2=runtime_nghttp2(), ASAN_OPTIONS="detect_leaks=1",
               UBSAN_OPTIONS="print_stacktrace=1")  # fmt: skip
    start = time.monotonic()
    with open(log, "w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=BUILD).returncode
    elapsed = time.monotonic() - start
    text = log.read_text(errors="replace")
    stats = {k: int(v) for k, v in STAT.findall(text)}
    progress = PROGRESS.findall(text)
    last = progress[-1] if progress else ("0", "0", "0", "0")
    runs_done = stats.get("number_of_executed_units", int(last[0]))
    finding = ""
    if rc != 0:
        artifacts = sorted(findings.glob("*"), key=lambda p: p.stat().st_mtime)
        finding = str(artifacts[-1]) if artifacts else f"exit code {rc}"
    return Result(t.name, elapsed, runs_done, stats.get("average_exec_per_sec", int(runs_done / max(elapsed, 1))),
                  int(last[1]), int(last[2]), int(last[3]), rc == 0, finding)  # fmt: skip


def merge(t: Target) -> None:
    """Fold what the runs found (build/fuzz/corpus/<name>/) into the committed seeds, minimized."""
    seeds, found = HERE / "corpus" / t.name, BUILD / "corpus" / t.name
    seeds.mkdir(parents=True, exist_ok=True)
    exe = [str(BUILD / t.name)] if t.module else [sys.executable, str(HERE / f"{t.name}.py")]
    env = dict(os.environ, EMBEDTRITON_FUZZ_NGHTTP2=runtime_nghttp2())
    subprocess.run([*exe, "-merge=1", f"-max_len={t.max_len}", str(seeds), str(found)], env=env, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10, help="per target (default 10)")
    parser.add_argument("--runs", type=int, default=0, help="stop a target after this many executions too")
    parser.add_argument("--target", action="append", help="only these (repeatable); default: all")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="targets run at once")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--merge", action="store_true", help="fold build/fuzz/corpus into the seeds")
    args = parser.parse_args()
    chosen = [t for t in TARGETS if not args.target or t.name in args.target]
    if args.target and len(chosen) != len(args.target):
        sys.exit(f"fuzz: targets are {', '.join(t.name for t in TARGETS)}")
    BUILD.mkdir(parents=True, exist_ok=True)
    print(f"fuzz: building {len(chosen)} target(s) into {BUILD} ...", flush=True)
    build(chosen)
    if args.build_only:
        return 0
    if args.merge:
        for t in chosen:
            merge(t)
        return 0
    logs = BUILD / "logs"
    logs.mkdir(exist_ok=True)
    print(f"fuzz: {len(chosen)} target(s), {args.seconds} s each, {args.jobs} at once; logs in {logs}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(fuzz, t, args.seconds, args.runs, logs / f"{t.name}.log"): t for t in chosen}
        results = []
        for future in concurrent.futures.as_completed(futures):
            r = future.result()
            results.append(r)
            print(f"fuzz: {r.target}: {'ok' if r.ok else 'FAILED: ' + r.finding} ({r.runs:,} runs)", flush=True)
    results.sort(key=lambda r: [t.name for t in TARGETS].index(r.target))
    print()
    print("| target | what | executions | exec/s | edges | features | corpus | seconds | result |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    about = {t.name: t.about for t in TARGETS}
    for r in results:
        verdict = "ok" if r.ok else f"**{r.finding}**"
        print(f"| {r.target} | {about[r.target]} | {r.runs:,} | {r.per_second:,} | {r.edges:,} | {r.features:,} "
              f"| {r.corpus:,} | {r.seconds:.0f} | {verdict} |")  # fmt: skip
    failed = [r for r in results if not r.ok]
    for r in failed:
        log = logs / f"{r.target}.log"
        print(f"\n==== {r.target}: the end of {log}", file=sys.stderr)
        print("\n".join(log.read_text(errors="replace").splitlines()[-60:]), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
