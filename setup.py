"""Builds the native modules: _native (also the Triton backend library) and _h2 (the gRPC transport)."""

import numpy
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "embedtriton._native",
            sources=["embedtriton/native/_native.c"],
            depends=["embedtriton/native/triton_api.h"],
            include_dirs=[numpy.get_include()],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
            libraries=["dl", "pthread"],
        ),
        Extension(
            "embedtriton._h2",
            sources=["embedtriton/native/_h2.c"],
            depends=["embedtriton/native/nghttp2_api.h"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
            libraries=["dl", "pthread"],
        ),
    ]
)
