"""Check that every native source compiles for aarch64 (NVIDIA's Grace machines), with Zig's C
toolchain from the package index (``pip install ziglang``): each C file as C11, the C++ file as
C++17, ``-c -Werror`` with the build's warnings (the objects thrown away), against this Python's and numpy's
headers (LP64 on both architectures) and zlib's header from the system. Nothing is linked; a
file that uses an x86 builtin or intrinsic fails here.

    python tools/check_aarch64.py        (nox -s lint runs it)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "embedtriton" / "native"
WARNINGS = ["-Wall", "-Wextra", "-Wno-missing-field-initializers", "-Werror"]


def main() -> int:
    import numpy

    zlib = Path("/usr/include/zlib.h")
    if not zlib.exists():
        print("check_aarch64: zlib's header is missing (apt-get install zlib1g-dev)", file=sys.stderr)
        return 1
    failed = []
    # (the system's zlib headers, none of its libc; and the objects, thrown away with the folder:
    # zig cc writes an object beside the working directory whatever -o says)
    with tempfile.TemporaryDirectory() as only_zlib, tempfile.TemporaryDirectory() as objects:
        for name in ("zlib.h", "zconf.h"):
            shutil.copy(Path("/usr/include") / name, only_zlib)
        includes = [
            f"-I{NATIVE / 'include'}",
            f"-I{numpy.get_include()}",
            f"-I{sysconfig.get_paths()['include']}",
            f"-I{only_zlib}",
        ]
        sources = sorted(NATIVE.glob("_native/*.c")) + sorted(NATIVE.glob("_h2/*.c"))
        sources += sorted(NATIVE.glob("_native/*.cc"))
        for source in sources:
            language = ["c++", "-std=c++17", "-fno-exceptions"] if source.suffix == ".cc" else ["cc", "-std=c11"]
            zig = [sys.executable, "-m", "ziglang", language[0], "-target", "aarch64-linux-gnu"]
            command = [*zig, "-c", "-o", str(Path(objects) / f"{source.name}.o")]
            done = subprocess.run(
                [*command, *language[1:], *WARNINGS, *includes, str(source)],
                capture_output=True,
                text=True,
                cwd=objects,
            )
            if done.returncode != 0:
                failed.append(source.relative_to(ROOT))
                print(done.stderr, file=sys.stderr)
    total = len(sources)
    if failed:
        print(f"check_aarch64: {len(failed)} of {total} files do not compile for aarch64: {failed}", file=sys.stderr)
        return 1
    print(f"check_aarch64: all {total} native sources compile for aarch64 (zig cc -target aarch64-linux-gnu)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
