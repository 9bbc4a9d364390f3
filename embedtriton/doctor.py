"""``embedtriton doctor`` and ``embedtriton install-runtime``: what this installation is made of,
and the one command that installs the Triton runtime.

The runtime is the ``libtritonserver`` bundled in PyTriton's wheel (``nvidia-pytriton``). That
wheel pins ``numpy<2`` for PyTriton's own Python code, which embedtriton does not use, so it is
installed without its dependencies: ``install-runtime`` runs exactly that, then checks what it
installed. ``doctor`` reports the platform, the installed wheel's tag, the native modules, the
runtime (path, version, C API version), the GPUs and the optional extras, one line each.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from . import __version__
from .errors import TritonError
from .triton.devices import cuda_devices
from .triton.runtime import HOME_VARIABLE, find_runtime, runtime_nghttp2

RUNTIME_PACKAGE = "nvidia-pytriton"
RUNTIME_VERSION = "0.7.0"  # Triton 2.51: the runtime embedtriton is built and tested against
RUNTIME_TRITON = "2.51"
# The platforms PyTriton publishes that wheel for (manylinux_2_35: glibc 2.35 or newer).
RUNTIME_GLIBC = (2, 35)
RUNTIME_MACHINES = ("x86_64", "aarch64")

# Optional extras: (what it enables, the distributions it needs)
EXTRAS = {
    "grpc": ("the gRPC endpoint", ("grpcio", "grpcio-health-checking", "tritonclient")),
    "tracing": ("OpenTelemetry tracing", ("opentelemetry-sdk",)),
    "onnx": ("ONNX models (Server.bind_onnx)", ("onnxruntime",)),
    "pytriton": ("PyTriton's API (embedtriton.pytriton)", ("tritonclient", "grpcio")),
    "ray": ("Ray Serve replicas (embedtriton.ray)", ("ray",)),
    "tune": ("the tuner's report.png", ("matplotlib",)),
    "openai client": ("the examples that call the OpenAI routes", ("openai",)),
}


def glibc() -> tuple[int, int] | None:
    """The C library's version, (major, minor), or None when it is not glibc."""
    name, version = platform.libc_ver()
    if name != "glibc" or not version:
        return None
    major, _, minor = version.partition(".")
    return int(major), int(minor.split(".")[0] or 0)


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def wheel_tags() -> list[str]:
    """The tags of the wheel embedtriton was installed from (its dist-info's WHEEL file)."""
    try:
        text = importlib.metadata.distribution("embedtriton").read_text("WHEEL") or ""
    except importlib.metadata.PackageNotFoundError:
        return []
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]


def _native_modules() -> list[tuple[str, bool, str]]:
    found = []
    for name in ("_native", "_h2"):
        try:
            module = importlib.import_module(f"embedtriton.{name}")
            found.append((f"embedtriton.{name}", True, str(module.__file__)))
        except ImportError as exc:
            where = str(exc)
            if not list(Path(__file__).parent.glob(f"{name}.*.so")):
                where += (
                    " (this is a source folder without the built modules: run from another folder, or pip install -e .)"
                )
            found.append((f"embedtriton.{name}", False, where))
    return found


def _triton_api_version() -> str:
    """The C API version libtritonserver reports (TRITONSERVER_ApiVersion), without starting a server."""
    from .triton.runtime import load_runtime

    try:
        _, lib = load_runtime()
        major, minor = ctypes.c_uint32(), ctypes.c_uint32()
        api_version = lib.TRITONSERVER_ApiVersion
        api_version.restype = ctypes.c_void_p  # (a TRITONSERVER_Error*: None when it succeeded)
        if api_version(ctypes.byref(major), ctypes.byref(minor)) is not None:
            return "unknown (TRITONSERVER_ApiVersion failed)"
        return f"{major.value}.{minor.value}"
    except (OSError, TritonError, AttributeError) as exc:
        return f"cannot be loaded: {exc}"


def _nghttp2() -> str:
    """The libnghttp2 the native gRPC transport would use (the system's, or the runtime's copy)."""
    try:
        from . import _h2

        info = _h2.library(runtime_nghttp2())
        return f"{info['version']} from {info['path']}"
    except (ImportError, OSError, RuntimeError) as exc:
        return f"not found ({exc}): the native gRPC transport cannot start; transport='grpcio' can"


def report() -> tuple[list[tuple[str, str]], list[str]]:
    """(name, value) lines of the report, and the problems that make embedtriton unusable here."""
    lines: list[tuple[str, str]] = []
    problems: list[str] = []
    libc = glibc()
    lines.append(("embedtriton", f"{__version__} in {Path(__file__).resolve().parent}"))
    tags = wheel_tags()
    lines.append(("wheel tag", ", ".join(tags) if tags else "none (not installed from a wheel)"))
    lines.append(("python", f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})"))
    lines.append(
        ("platform", f"{platform.system()} {platform.machine()}, glibc {'.'.join(map(str, libc or ())) or '?'}")
    )
    lines.append(("numpy", _version("numpy") or "missing"))
    native = _native_modules()
    for name, ok, where in native:
        lines.append((name, where if ok else f"cannot be imported: {where}"))
        if not ok:
            problems.append(f"{name} cannot be imported: {where}")
    try:
        runtime = find_runtime()
        lines.append(("triton runtime", f"{runtime.library} ({runtime.origin})"))
        installed = _version(RUNTIME_PACKAGE)
        if runtime.origin != f"{RUNTIME_PACKAGE} wheel":
            lines.append(("runtime version", f"from {HOME_VARIABLE}: tested with Triton {RUNTIME_TRITON}"))
        elif installed != RUNTIME_VERSION:
            lines.append(("runtime version", f"{RUNTIME_PACKAGE} {installed}: tested with {RUNTIME_VERSION}"))
        else:
            lines.append(("runtime version", f"{RUNTIME_PACKAGE} {installed} (Triton {RUNTIME_TRITON})"))
        if all(ok for _, ok, _ in native):
            lines.append(("triton C API", _triton_api_version()))
    except TritonError:
        lines.append(("triton runtime", "not found: run `embedtriton install-runtime`"))
        problems.append("no Triton runtime: run `embedtriton install-runtime`")
    count, description = cuda_devices()
    lines.append(("gpus", f"{count}: {description}" if count else f"none ({description})"))
    lines.append(("libnghttp2", _nghttp2()))
    for extra, (what, distributions) in EXTRAS.items():
        versions = [(d, _version(d)) for d in distributions]
        missing = [d for d, v in versions if v is None]
        found = ", ".join(f"{d} {v}" for d, v in versions if v is not None)
        lines.append(
            (f"extra {extra}", f"yes ({found})" if not missing else f"no ({what}; missing {', '.join(missing)})")
        )
    return lines, problems


def doctor(args: argparse.Namespace) -> int:
    """Print the report; 0 when embedtriton can serve here, 1 otherwise (the problems follow)."""
    lines, problems = report()
    width = max(len(name) for name, _ in lines)
    for name, value in lines:
        print(f"{name:<{width}}  {value}")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


def install_runtime(args: argparse.Namespace, run: Callable[..., int] = subprocess.call) -> int:
    """Install the Triton runtime into this Python (``pip install --no-deps nvidia-pytriton==0.7.0``),
    then check that it is found and is that version. ``--check``: only report."""
    command = [sys.executable, "-m", "pip", "install", "--no-deps", f"{RUNTIME_PACKAGE}=={RUNTIME_VERSION}"]
    if os.environ.get(HOME_VARIABLE):
        print(f"{HOME_VARIABLE} is set: embedtriton uses the Triton install it names, not {RUNTIME_PACKAGE}.")
    libc, machine = glibc(), platform.machine()
    if machine not in RUNTIME_MACHINES or libc is None or libc < RUNTIME_GLIBC:
        found = f"{machine}, glibc {'.'.join(map(str, libc)) if libc else 'missing'}"
        print(
            f"{RUNTIME_PACKAGE} {RUNTIME_VERSION} is published for Linux x86_64 and aarch64 with glibc "
            f"{RUNTIME_GLIBC[0]}.{RUNTIME_GLIBC[1]} or newer; this machine has {found}. Use a Triton install "
            f"instead: {HOME_VARIABLE}=/opt/tritonserver (from NVIDIA's Triton container).",
            file=sys.stderr,
        )
        return 2
    installed = _version(RUNTIME_PACKAGE)
    if args.check or installed == RUNTIME_VERSION:
        if installed == RUNTIME_VERSION:
            print(f"{RUNTIME_PACKAGE} {installed} is installed.")
        else:
            print(
                f"{RUNTIME_PACKAGE} {RUNTIME_VERSION} is not installed (found: {installed}). Run: {' '.join(command)}"
            )
        return _found_runtime() if installed == RUNTIME_VERSION else 1
    numpy_before = _version("numpy")
    print(f"installing the Triton runtime: {' '.join(command)}", flush=True)
    if run(command) != 0:
        print(f"pip failed: run `{' '.join(command)}` to see why.", file=sys.stderr)
        return 1
    importlib.invalidate_caches()
    if _version("numpy") != numpy_before:  # (--no-deps: never expected)
        print(f"warning: numpy changed from {numpy_before} to {_version('numpy')}", file=sys.stderr)
    return _found_runtime()


def _found_runtime() -> int:
    try:
        runtime = find_runtime()
    except TritonError as exc:
        print(f"no Triton runtime found after all: {exc}", file=sys.stderr)
        return 1
    print(f"Triton runtime: {runtime.library} ({runtime.origin}, {RUNTIME_PACKAGE} {_version(RUNTIME_PACKAGE)})")
    return 0


def add_commands(commands: argparse._SubParsersAction) -> None:
    """The two commands, on ``embedtriton``'s subcommand parser."""
    found = commands.add_parser("doctor", help="report the platform, wheel, runtime, GPUs and extras found")
    found.set_defaults(run=doctor)
    install = commands.add_parser(
        "install-runtime",
        help=f"install the Triton runtime ({RUNTIME_PACKAGE}=={RUNTIME_VERSION}, without its numpy<2 pin) and check it",
    )
    install.add_argument("--check", action="store_true", help="only say whether it is installed")
    install.set_defaults(run=install_runtime)
