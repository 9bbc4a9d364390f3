"""Builds the native modules: _native (also the Triton backend library) and _h2 (the gRPC transport).

Each module's C files live in a folder of their own (embedtriton/native/_native/, .../_h2/) with
one private header; the declarations of the dlopened C APIs are in embedtriton/native/include/."""

import os
from glob import glob

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = "embedtriton/native"
INCLUDE = f"{NATIVE}/include"
# Hidden by default, and an explicit export list (exports.map, a linker version script): each
# library exports only what Python and Triton look up in it, never its internal functions.
# Link-time optimisation lets the compiler inline across the files of one module (the GIL and
# completion helpers of the per-request path), as it did when each module was one file.
# EMBEDTRITON_NO_LTO=1 builds without it, for toolchains whose linker cannot run GCC's LTO plugin.
LTO = [] if os.environ.get("EMBEDTRITON_NO_LTO") == "1" else ["-flto"]
# EMBEDTRITON_SANITIZE=address,undefined (or one of them) builds the modules under the sanitizers
# for `nox -s tests-asan` (docs/development.md): no LTO, -O1 with frame pointers and debug
# information (readable reports), every UBSan check fatal. The compiler is clang (CC overrides it):
# its shared ASan runtime carries UBSan too, so one LD_PRELOAD serves both and every report honours
# log_path (gcc's separate libubsan writes to stderr only, where pytest's capture loses it). Python
# is not built with them: the runtime must be preloaded. The objects go to build/sanitize/.
SANITIZERS = ("address", "undefined")
SANITIZE = [s for s in os.environ.get("EMBEDTRITON_SANITIZE", "").replace(" ", "").split(",") if s]
if any(s not in SANITIZERS for s in SANITIZE):
    raise SystemExit(f"EMBEDTRITON_SANITIZE takes {', '.join(SANITIZERS)} (comma-separated), not {SANITIZE}")
if SANITIZE:
    os.environ.setdefault("CC", "clang")
    os.environ.setdefault("CXX", "clang++")
    os.environ.setdefault("LDSHARED", f"{os.environ['CC']} -shared")
    OPT = ["-O1", "-g", "-fno-omit-frame-pointer", f"-fsanitize={','.join(SANITIZE)}", "-fno-sanitize-recover=all"]
    LTO = []
    LINK = ["-shared-libasan"] if "address" in SANITIZE else []
else:
    OPT, LINK = ["-O2"], []
# EMBEDTRITON_NUMPY_INCLUDE: numpy's headers from elsewhere (tools/wheels.py cross-compiles for aarch64
# with the aarch64 numpy wheel's headers); this Python's numpy otherwise.
NUMPY_INCLUDE = os.environ.get("EMBEDTRITON_NUMPY_INCLUDE") or numpy.get_include()
CFLAGS = [*OPT, "-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers", "-fvisibility=hidden", *LTO]


def exports(module: str) -> list[str]:
    return [*OPT, *LTO, *LINK, f"-Wl,--version-script={NATIVE}/{module}/exports.map"]


def files(pattern: str) -> list[str]:
    return sorted(glob(pattern))


class BuildExt(build_ext):
    """C sources with CFLAGS; the one C++ source (_native/numtext.cc: the standard library's number
    conversions) as C++17 with the same warnings."""

    def build_extension(self, ext: Extension) -> None:
        compile_one = self.compiler._compile

        def compile_source(obj, src, ext_, cc_args, extra_postargs, pp_opts):  # type: ignore[no-untyped-def]
            if src.endswith(".cc"):
                extra_postargs = [a for a in extra_postargs if a != "-std=c11"] + ["-std=c++17", "-fno-exceptions"]
            compile_one(obj, src, ext_, cc_args, extra_postargs, pp_opts)

        self.compiler._compile = compile_source
        try:
            super().build_extension(ext)
        finally:
            self.compiler._compile = compile_one


setup(
    cmdclass={"build_ext": BuildExt},
    options={"build": {"build_base": "build/sanitize"}} if SANITIZE else {},
    ext_modules=[
        Extension(
            "embedtriton._native",
            sources=files(f"{NATIVE}/_native/*.c") + files(f"{NATIVE}/_native/*.cc"),
            depends=[
                *files(f"{NATIVE}/_native/*.h"),
                f"{INCLUDE}/triton_api.h",
                f"{INCLUDE}/dlpack.h",
                f"{INCLUDE}/h2_reply.h",
                f"{NATIVE}/_native/exports.map",
            ],
            include_dirs=[INCLUDE, NUMPY_INCLUDE],
            extra_compile_args=CFLAGS,
            extra_link_args=exports("_native"),
            libraries=["dl", "pthread", "stdc++"],
        ),
        Extension(
            "embedtriton._h2",
            sources=files(f"{NATIVE}/_h2/*.c"),
            depends=[
                *files(f"{NATIVE}/_h2/*.h"),
                f"{INCLUDE}/nghttp2_api.h",
                f"{INCLUDE}/h2_reply.h",
                f"{NATIVE}/_h2/exports.map",
            ],
            include_dirs=[INCLUDE],
            extra_compile_args=CFLAGS,
            extra_link_args=exports("_h2"),
            # zlib for gRPC message compression: linked, not dlopened like libnghttp2 and OpenSSL, as
            # libz.so.1 is wherever CPython's zlib module is (and manylinux wheels may depend on it).
            libraries=["dl", "pthread", "z"],
        ),
    ],
)
