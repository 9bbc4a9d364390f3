#!/usr/bin/env bash
# The one prepared run on the GPU machine (issue 26): install what it lacks from the carried
# wheels, build the native modules for its Python, run tests/gpu, then the zero-copy benchmark.
#
# Here, once: bash tests/gpu/prepare_wheels.sh   (fills the git-ignored .whl/, ~45 MiB)
# There, from the repository root, with ".whl" carried:
#
#     bash tests/gpu/run_on_gpu.sh
#
# The GPU machine has Python 3.12 (python3, with torch, cupy-cuda13x, cuda-bindings 13, numpy 2,
# pytest and pytest-timeout) and no package registry. Everything goes to $OUT (the device tool's
# folder that comes back; ./.device/out when unset): gpu_tests.log, bench.txt, bench.json,
# facts.txt. The benchmark runs whatever the tests did. Exit status: 0 when the set-up, the
# tests and the benchmark's checks all passed.
#
# Settings (environment):
#   GPU_TESTS="-k cudashm"   extra pytest arguments (a subset; default: all of tests/gpu)
#   GPU_MAXFAIL=1            stop the tests after this many failures (1 is -x; 0: never stop)
#   GPU_TESTS_BUDGET=300     seconds for the whole pytest run before it is stopped
#   BENCH=0                  skip the benchmark; BENCH_ARGS="--quick" passes arguments to it
#   BENCH_BUDGET=120         seconds for the benchmark before it is stopped
#   PY=python3               the interpreter; SITE=/tmp/site where the wheels go
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/.device/out}
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset EMBEDTRITON_TRITON_HOME # the carried nvidia-pytriton wheel's runtime, found through PYTHONPATH
T0=$(date +%s)
section() { echo; echo "=== $* [$(($(date +%s) - T0)) s]"; }
setup_rc=0 tests_rc=- bench_rc=-

section "facts"
{
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi -L 2>&1
        nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1
    else
        echo "nvidia-smi: not found"
    fi
    uname -srm
    "$PY" - <<'EOF'
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
for name in ("numpy", "cupy", "torch", "cuda.bindings", "grpc", "google.protobuf", "setuptools", "pytest",
             "pytest_timeout", "ml_dtypes"):
    try:
        module = importlib.import_module(name)
        print(f"  {name} {getattr(module, '__version__', '?')}")
    except Exception as exc:
        print(f"  {name}: not importable ({type(exc).__name__}: {exc})")
try:
    import torch
    print("  torch.cuda:", torch.version.cuda, torch.cuda.is_available(), torch.cuda.device_count())
except Exception as exc:
    print("  torch.cuda:", exc)
try:
    import cupy
    print("  cupy devices:", cupy.cuda.runtime.getDeviceCount(), "runtime", cupy.cuda.runtime.runtimeGetVersion(),
          "driver", cupy.cuda.runtime.driverGetVersion())
except Exception as exc:
    print("  cupy devices:", exc)
EOF
} 2>&1 | tee "$OUT/facts.txt"

section "install the carried wheels into $SITE"
if ls .whl/*.whl >/dev/null 2>&1; then
    ls .whl | sed 's/^/  /'
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl 2>&1 |
        grep -v "^WARNING: Target directory" || true
    [ -d "$SITE/pytriton" ] && [ -d "$SITE/tritonclient" ] || { echo "the wheels did not install"; setup_rc=1; }
else
    echo "no .whl/*.whl: run tests/gpu/prepare_wheels.sh here and carry .whl"
    setup_rc=1
fi
export PYTHONPATH=$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}

section "build the native modules for this Python"
# The GPU machine's /opt/gcc cannot run the LTO plugin (ld: "could not run lto-wrapper").
export EMBEDTRITON_NO_LTO=${EMBEDTRITON_NO_LTO:-1}
if ! "$PY" setup.py -q build_ext --inplace --force -j 4 >"$OUT/build.log" 2>&1; then
    # an older setuptools can refuse pyproject.toml's metadata (license = "..." needs >= 77):
    # build the same extensions from a copy without it, and bring the libraries back
    echo "setup.py build_ext failed (tail of build.log below); building from a copy without pyproject.toml"
    tail -15 "$OUT/build.log"
    tmp=$(mktemp -d)
    suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
    mkdir -p "$tmp/embedtriton" && cp -r setup.py "$tmp"/ && cp -r embedtriton/native "$tmp/embedtriton/"
    (cd "$tmp" && "$PY" setup.py -q build_ext --inplace --force -j 4) >>"$OUT/build.log" 2>&1 &&
        cp "$tmp/embedtriton/_native$suffix" "$tmp/embedtriton/_h2$suffix" embedtriton/ ||
        { tail -30 "$OUT/build.log"; setup_rc=1; }
    rm -rf "$tmp"
fi
ls -la embedtriton/*.so 2>&1 | sed 's/^/  /'

section "imports"
(set -o pipefail; "$PY" - 2>&1 <<'EOF' | tee -a "$OUT/facts.txt") || setup_rc=1
import embedtriton, embedtriton._native, embedtriton._h2
print("embedtriton", embedtriton.__file__, embedtriton._native.__file__)
from embedtriton.triton.runtime import find_runtime
print("runtime", find_runtime())
from embedtriton.triton.devices import cuda_devices
print("CUDA devices seen by the Triton runtime's cudart:", cuda_devices())
import google.protobuf, grpc, tritonclient.grpc, tritonclient.http
print("grpc", grpc.__version__, "protobuf", google.protobuf.__version__)
try:
    import cuda.bindings, tritonclient.utils.cuda_shared_memory as cudashm
    print("tritonclient cudashm on cuda-bindings", cuda.bindings.__version__, cudashm.__file__)
except Exception as exc:
    print("tritonclient cudashm NOT importable:", type(exc).__name__, exc)
for name in ("DeviceArray",):
    print(f"embedtriton.{name}:", "present" if hasattr(embedtriton, name) else "MISSING")
EOF

if [ "$setup_rc" != 0 ]; then
    echo "set-up failed: the tests and the benchmark would not mean anything"
else
    section "tests/gpu"
    maxfail=${GPU_MAXFAIL:-1}
    # shellcheck disable=SC2086
    (
        set -o pipefail
        timeout -k 15 "${GPU_TESTS_BUDGET:-300}" "$PY" -m pytest tests/gpu -v -rfEs --maxfail="$maxfail" \
            --timeout 120 -p no:cacheprovider ${GPU_TESTS:-} 2>&1 | tee "$OUT/gpu_tests.log"
    )
    tests_rc=$?
    [ "$tests_rc" = 124 ] && echo "tests/gpu stopped after ${GPU_TESTS_BUDGET:-300} s (GPU_TESTS_BUDGET)"

    if [ "${BENCH:-1}" != 0 ]; then
        section "benchmark: benchmarks/bench_gpu.py ${BENCH_ARGS:-}"
        # shellcheck disable=SC2086
        (
            set -o pipefail
            timeout -k 15 "${BENCH_BUDGET:-120}" "$PY" benchmarks/bench_gpu.py --json "$OUT/bench.json" \
                ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt"
        )
        bench_rc=$?
    fi
fi

section "summary"
{
    head -2 "$OUT/facts.txt"
    echo "set-up: $([ "$setup_rc" = 0 ] && echo ok || echo FAILED)"
    if [ -f "$OUT/gpu_tests.log" ]; then
        echo "tests/gpu (rc $tests_rc):"
        grep -E "^(FAILED|ERROR) " "$OUT/gpu_tests.log" | head -20 | sed 's/^/  /'
        grep -E "^=+ .*(passed|failed|error|skipped|no tests ran).* =+$" "$OUT/gpu_tests.log" | tail -1 | sed 's/^/  /'
    fi
    if [ -f "$OUT/bench.txt" ]; then
        echo "benchmark (rc $bench_rc):"
        grep -E "^\||^checks:|needs a CUDA GPU" "$OUT/bench.txt" | sed 's/^/  /'
    fi
    echo "total $(($(date +%s) - T0)) s"
} 2>&1 | tee "$OUT/summary.txt"

[ "$setup_rc" = 0 ] && [ "$tests_rc" = 0 ] && { [ "$bench_rc" = 0 ] || [ "$bench_rc" = - ]; }
