"""Builds the native modules: _native (also the Triton backend library) and _h2 (the gRPC transport).

Each module's C files live in a folder of their own (embedtriton/native/_native/, .../_h2/) with
one private header; the declarations of the dlopened C APIs are in embedtriton/native/include/."""

from glob import glob

import numpy
from setuptools import Extension, setup

NATIVE = "embedtriton/native"
INCLUDE = f"{NATIVE}/include"
CFLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"]


def files(pattern: str) -> list[str]:
    return sorted(glob(pattern))


setup(
    ext_modules=[
        Extension(
            "embedtriton._native",
            sources=files(f"{NATIVE}/_native/*.c"),
            depends=files(f"{NATIVE}/_native/*.h") + files(f"{INCLUDE}/*.h"),
            include_dirs=[INCLUDE, numpy.get_include()],
            extra_compile_args=CFLAGS,
            libraries=["dl", "pthread"],
        ),
        Extension(
            "embedtriton._h2",
            sources=files(f"{NATIVE}/_h2/*.c"),
            depends=files(f"{NATIVE}/_h2/*.h") + [f"{INCLUDE}/nghttp2_api.h"],
            include_dirs=[INCLUDE],
            extra_compile_args=CFLAGS,
            libraries=["dl", "pthread"],
        ),
    ]
)
