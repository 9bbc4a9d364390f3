#!/usr/bin/env bash
# The prepared runs on the GPU machine (issues 26 and 50): install what it lacks from the carried
# wheels, build the native modules for its Python, run tests/gpu, the zero-copy benchmark with its
# stages, the torch model benchmark, and (SUITE=1) the whole test suite.
#
# Here, once: bash tests/gpu/prepare_wheels.sh --suite   (fills the git-ignored .whl/, ~52 MiB)
# There, from the repository root, with ".whl" carried, two calls on the same warm machine (one
# call may run 10 minutes):
#
#     bash tests/gpu/run_on_gpu.sh                          # tests/gpu and the benchmarks, ~5 min
#     SUITE=1 GPU=0 BENCH=0 TORCH_BENCH=0 REBUILD=0 bash tests/gpu/run_on_gpu.sh   # the suite, ~7 min
#
# The GPU machine has Python 3.12 (python3, with torch, cupy-cuda13x, cuda-bindings 13, numpy 2,
# pytest and pytest-timeout) and no package registry. Everything goes to $OUT (the device tool's
# folder that comes back; ./.device/out when unset): gpu_tests.log, bench.txt, bench.json,
# torch.txt, suite.log, facts.txt, summary.txt. The benchmark runs whatever the tests did. Exit status: 0 when the set-up, the
# tests and the benchmark's checks all passed.
#
# Settings (environment):
#   GPU=0                    skip tests/gpu
#   GPU_TESTS="-k cudashm"   extra pytest arguments (a subset; default: all of tests/gpu)
#   GPU_MAXFAIL=1            stop the tests after this many failures (1 is -x; 0: never stop)
#   GPU_TESTS_BUDGET=300     seconds for the whole pytest run before it is stopped
#   BENCH=0                  skip bench_gpu.py; BENCH_ARGS (default "--stages") are its arguments
#   BENCH_BUDGET=200         seconds for it before it is stopped (7 sizes x 8 ways x 5 rounds: ~2 min)
#   TORCH_BENCH=0            skip bench_torch.py; TORCH_BENCH_ARGS (default "--no-python-backend":
#                            the stub needs numpy<2, not on that machine) are its arguments
#   TORCH_BENCH_BUDGET=150   seconds for it before it is stopped
#   SUITE=1                  run the whole test suite (but tests/gpu) with EMBEDTRITON_TESTS_OFFLINE=1
#                            (tests that would pip-install skip); SUITE_ARGS extra pytest arguments,
#                            SUITE_JOBS=4 runs it on 4 pytest-xdist workers, SUITE_BUDGET=540 seconds
#   PY=python3               the interpreter; SITE=/tmp/site where the wheels go
#   REBUILD=0                keep the native modules an earlier call on the same machine built
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
setup_rc=0 tests_rc=- bench_rc=- torch_rc=- suite_rc=-

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
suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
if [ "${REBUILD:-1}" = 0 ] && [ -f "embedtriton/_native$suffix" ] && [ -f "embedtriton/_h2$suffix" ]; then
    echo "REBUILD=0: keeping the modules an earlier call built on this machine"
elif ! "$PY" setup.py -q build_ext --inplace --force -j 4 >"$OUT/build.log" 2>&1; then
    # an older setuptools can refuse pyproject.toml's metadata (license = "..." needs >= 77):
    # build the same extensions from a copy without it, and bring the libraries back
    echo "setup.py build_ext failed (tail of build.log below); building from a copy without pyproject.toml"
    tail -15 "$OUT/build.log"
    tmp=$(mktemp -d)
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
    if [ "${GPU:-1}" != 0 ]; then
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
    fi

    if [ "${BENCH:-1}" != 0 ]; then
        section "benchmark: benchmarks/bench_gpu.py ${BENCH_ARGS:---stages}"
        # shellcheck disable=SC2086
        (
            set -o pipefail
            timeout -k 15 "${BENCH_BUDGET:-200}" "$PY" benchmarks/bench_gpu.py --json "$OUT/bench.json" \
                ${BENCH_ARGS:---stages} 2>&1 | tee "$OUT/bench.txt"
        )
        bench_rc=$?
    fi

    if [ "${TORCH_BENCH:-1}" != 0 ]; then
        section "benchmark: benchmarks/bench_torch.py ${TORCH_BENCH_ARGS:---no-python-backend}"
        # shellcheck disable=SC2086
        (
            set -o pipefail
            timeout -k 15 "${TORCH_BENCH_BUDGET:-150}" "$PY" benchmarks/bench_torch.py --json "$OUT/torch.json" \
                ${TORCH_BENCH_ARGS:---no-python-backend} 2>&1 | tee "$OUT/torch.txt"
        )
        torch_rc=$?
    fi

    if [ "${SUITE:-0}" != 0 ]; then
        section "the whole test suite (tests/gpu aside)"
        # shellcheck disable=SC2086
        (
            set -o pipefail
            EMBEDTRITON_TESTS_OFFLINE=1 timeout -k 15 "${SUITE_BUDGET:-540}" "$PY" -m pytest tests --ignore=tests/gpu \
                -q -rfEs --timeout 120 --durations=15 -p no:cacheprovider ${SUITE_JOBS:+-n $SUITE_JOBS} \
                ${SUITE_ARGS:-} 2>&1 | tee "$OUT/suite.log"
        )
        suite_rc=$?
        [ "$suite_rc" = 124 ] && echo "the suite stopped after ${SUITE_BUDGET:-540} s (SUITE_BUDGET)"
    fi
fi

section "summary"
{
    head -2 "$OUT/facts.txt"
    echo "set-up: $([ "$setup_rc" = 0 ] && echo ok || echo FAILED)"
    if [ -f "$OUT/gpu_tests.log" ]; then
        echo "tests/gpu (rc $tests_rc):"
        grep -E "^(FAILED|ERROR) tests/" "$OUT/gpu_tests.log" | head -20 | sed 's/^/  /'
        grep -E "^=+ .*(passed|failed|error|skipped|no tests ran).* =+$" "$OUT/gpu_tests.log" | tail -1 | sed 's/^/  /'
    fi
    if [ -f "$OUT/bench.txt" ]; then
        echo "benchmark (rc $bench_rc):"
        grep -E "^\||^checks:|needs a CUDA GPU" "$OUT/bench.txt" | sed 's/^/  /'
    fi
    if [ -f "$OUT/torch.txt" ]; then
        echo "torch benchmark (rc $torch_rc):"
        grep -E "^\||^torch |needs torch" "$OUT/torch.txt" | sed 's/^/  /'
    fi
    if [ -f "$OUT/suite.log" ]; then
        echo "the suite (rc $suite_rc):"
        grep -E "^(FAILED|ERROR) tests/" "$OUT/suite.log" | head -40 | sed 's/^/  /'
        grep -E "(passed|failed|error|skipped|no tests ran).* in [0-9.]+s" "$OUT/suite.log" | tail -1 | sed 's/^/  /'
    fi
    echo "total $(($(date +%s) - T0)) s"
} 2>&1 | tee "$OUT/summary.txt"

ok() { [ "$1" = 0 ] || [ "$1" = - ]; }
[ "$setup_rc" = 0 ] && ok "$tests_rc" && ok "$bench_rc" && ok "$torch_rc" && ok "$suite_rc"
