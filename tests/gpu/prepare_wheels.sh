#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with the wheels that tests/gpu/run_on_gpu.sh installs on the GPU
# machine, which has Python 3.12, torch, cupy-cuda13x, cuda-bindings 13, numpy 2, pytest and
# pytest-timeout, but no package registry. Run it here, in the repository root, once:
#
#     bash tests/gpu/prepare_wheels.sh            # then carry ".whl" in the device call
#     bash tests/gpu/prepare_wheels.sh --suite    # also what the whole test suite imports (~7 MiB)
#
# The nvidia-pytriton wheel (the Triton runtime, 55 MB) is slimmed to about 33 MB so that the
# working tree and the wheels fit the 64 MiB a device call carries: it loses the bundled
# libpython 3.13 (never loaded: runtime.py skips it), the tritonserver executable (embedtriton
# loads libtritonserver in-process) and the python backend stubs of Pythons other than 3.12.
# Its RECORD is rewritten to match, so pip installs it as usual.
#
# grpcio and protobuf travel too although the GPU machine has them: tritonclient 2.73's
# generated modules need protobuf>=6.30 and grpcio-health-checking 1.81 needs grpcio>=1.81,
# and the versions there are not known ahead; these are the dev environment's versions.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=${PYTHON:-.venv/bin/python}
mkdir -p .whl

PLATFORMS=""
for p in manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
         manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    PLATFORMS="$PLATFORMS --platform $p"
done
# shellcheck disable=SC2086
download() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS -d "$1" "${@:2}"; }

# What embedtriton[grpc,http] and tritonclient[grpc,http] 2.73 need that the GPU machine lacks
# (numpy, urllib3, aiohttp, packaging, certifi, ml-dtypes and cuda-bindings are there).
download .whl \
    tritonclient==2.73.0 python-rapidjson==1.25 \
    geventhttpclient==2.6.1 gevent==26.9.0 greenlet==3.3.2 zope.event==6.2 zope.interface==8.7 brotli==1.2.1 \
    grpcio==1.85.3 protobuf==6.33.6 grpcio-health-checking==1.81.1

# The whole suite (run_on_gpu.sh SUITE=1) imports these too; the GPU machine has hypothesis, requests,
# pillow, onnx, onnxruntime, typer, typing-inspect and wrapt. Pinned to what the tests session
# resolves today. Not carried: ray (its tests skip) and kubernetes-validate (22 MiB; its tests skip).
if [ "${1:-}" = "--suite" ]; then
    download .whl \
        h2==4.4.1 hpack==4.2.0 hyperframe==6.1.0 \
        opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2 \
        openai==3.63.0 httpx2==2.17.0 httpcore2==2.17.0 anyio==4.16.0 sniffio==1.3.1 jiter==0.19.0 distro==1.9.0 \
        pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
        typing-extensions==4.16.0 truststore==0.10.5 h11==0.16.0 idna==3.21 pyzmq==27.3.0 sh==2.4.0 \
        importlib-metadata==10.2.0 zipp==4.1.2
fi

WHEEL=nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl
if [ ! -f ".whl/$WHEEL" ] || ! unzip -l ".whl/$WHEEL" | grep -q "SLIMMED"; then
    tmp=$(mktemp -d)
    download "$tmp" nvidia-pytriton==0.7.0
    "$PY" - "$tmp/$WHEEL" ".whl/$WHEEL" <<'EOF'
import re
import sys
import zipfile

src, dst = sys.argv[1], sys.argv[2]
drop = re.compile(
    r"^(nvidia_pytriton\.libs/libpython3[^/]*"
    r"|pytriton/tritonserver/bin/.*"
    r"|pytriton/tritonserver/python_backend_stubs/(?!3\.12/).*)$"
)
kept = dropped = 0
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
    for info in zin.infolist():
        if drop.match(info.filename):
            dropped += info.file_size
            continue
        data = zin.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines(keepends=True)
            data = "".join(line for line in lines if not drop.match(line.split(",", 1)[0])).encode()
        zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
        kept += info.file_size
    # a marker (outside every package, listed nowhere) that says this copy was slimmed
    zout.writestr("nvidia_pytriton-0.7.0.dist-info/SLIMMED", "")
print(f"nvidia-pytriton slimmed: kept {kept / 2**20:.1f} MiB unpacked, dropped {dropped / 2**20:.1f} MiB")
EOF
    rm -rf "$tmp"
fi
du -cb .whl/*.whl | sort -n | awk '{printf "%8.2f MiB  %s\n", $1 / 2^20, $2}'
