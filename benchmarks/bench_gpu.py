"""GPU tensors through an identity model: the zero-copy path against a host round trip, with a
plain device-to-device copy as the floor, all measured in the same run (needs a CUDA GPU and cupy).

For cupy float32 tensors of 1, 4, 16, 64 and 256 MiB, three ways, in interleaved rounds:

- zero-copy: ``model.infer({"x": cupy_array}, output_device="gpu")``. The input reaches the
  callable as the caller's own device memory, the callable returns it, the backend copies it
  device to device into Triton's output buffer (GPU memory from our response allocator) and the
  caller gets a DLPack-capable device array; the clock stops after a device synchronize;
- floor: ``y = x.copy()`` in cupy plus a device synchronize (one device-to-device copy, the least
  the zero-copy path must do since the output is a new buffer);
- host round trip, for contrast: ``cupy.asnumpy(x)`` -> ``infer`` with numpy -> ``cupy.asarray``
  of the output, what a host-only server makes a GPU application do.

Each size is checked once (the output equals the input, through ``cupy.from_dlpack``). Prints a
markdown table of medians (per round, the median of the round's calls; then the median of the
rounds) with ratios to the floor, and writes benchmarks/results/gpu_zero_copy.json (or --json).

    python benchmarks/bench_gpu.py [--quick] [--rounds 5] [--sizes 1,4,16,64,256]

Without a GPU (or cupy) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
MIB = 2**20
WAYS = ("zero-copy", "floor", "host round trip")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def gpu_or_reason():
    """(cupy, "") when cupy sees a CUDA device, else (None, why not)."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a cupy build that cannot load its CUDA libraries
        return None, f"cupy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return None, f"cupy sees no CUDA device ({type(exc).__name__}: {exc})"
    if count < 1:
        return None, "cupy sees no CUDA device"
    return cupy, ""


def timed_calls(call, sync, iterations: int) -> list[float]:
    """Microseconds of each of ``iterations`` calls, each followed by a device synchronize."""
    out = []
    clock = time.perf_counter_ns
    for _ in range(iterations):
        start = clock()
        call()
        sync()
        out.append((clock() - start) / 1000)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and calls (a smoke check)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5, --quick 2)")
    parser.add_argument("--sizes", default="1,4,16,64,256", help="tensor sizes in MiB, comma-separated")
    parser.add_argument(
        "--seconds", type=float, default=None, help="time per way, size and round (default 0.25, --quick 0.08)"
    )
    parser.add_argument(
        "--cuda-pool-mib", type=int, default=0, help="ServerConfig CUDA memory pool on GPU 0 (0: default)"
    )
    parser.add_argument("--json", type=Path, default=RESULTS / "gpu_zero_copy.json", help="where to write the results")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 5)
    seconds = args.seconds or (0.08 if args.quick else 0.25)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    cupy, why = gpu_or_reason()
    if cupy is None:
        print(f"gpu_zero_copy: needs a CUDA GPU and cupy; skipped: {why}")
        return 0

    from embedtriton import ModelConfig, Server, ServerConfig, Tensor

    device = cupy.cuda.Device()
    sync = device.synchronize
    props = cupy.cuda.runtime.getDeviceProperties(device.id)
    gpu_name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])

    def identity(requests):
        return [{"y": r["x"]} for r in requests]

    try:
        config = ModelConfig(batching=False, gpu_arrays="cupy")
    except TypeError as exc:  # a build without the option: cupy is the default there anyway
        log(f"ModelConfig(gpu_arrays='cupy') refused ({exc}); binding with the default")
        config = ModelConfig(batching=False)
    server_config = ServerConfig(cuda_memory_pool_byte_size={0: args.cuda_pool_mib * MIB} if args.cuda_pool_mib else {})
    server = Server(server_config)
    server.bind(
        "identity",
        identity,
        inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
        config=config,
    )

    log(
        f"gpu_zero_copy: {gpu_name}, cupy {cupy.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores; sizes {sizes} MiB, {rounds} interleaved rounds of ~{seconds:.2f} s per way"
        + (f"; CUDA memory pool {args.cuda_pool_mib} MiB" if args.cuda_pool_mib else "")
    )
    started = time.perf_counter()
    samples: dict[int, dict[str, list[float]]] = {size: {way: [] for way in WAYS} for size in sizes}
    errors: dict[int, dict[str, str]] = {size: {} for size in sizes}
    checks: dict[int, str] = {}
    iterations: dict[int, dict[str, int]] = {size: {} for size in sizes}
    with server:
        model = server.model("identity")
        inputs = {size: cupy.arange(size * MIB // 4, dtype=cupy.float32) for size in sizes}
        sync()

        def ways_for(x):
            def zero_copy():
                out = model.infer({"x": x}, output_device="gpu")
                del out

            def floor():
                y = x.copy()
                del y

            def host_round_trip():
                out = model.infer({"x": cupy.asnumpy(x)})
                y = cupy.asarray(out["y"])
                del y, out

            return {"zero-copy": zero_copy, "floor": floor, "host round trip": host_round_trip}

        # once per size: correctness, warm-up, and how many calls fill `seconds`
        for size in sizes:
            x = inputs[size]
            try:
                out = model.infer({"x": x}, output_device="gpu")
                y_dev = out["y"]
                y = cupy.from_dlpack(y_dev)
                sync()
                same = bool(cupy.array_equal(x, y))
                checks[size] = (
                    f"ok ({type(y_dev).__name__} on {getattr(y_dev, 'device', '?')})" if same else "WRONG DATA"
                )
                del out, y_dev, y
            except Exception as exc:
                checks[size] = f"FAILED: {type(exc).__name__}: {exc}"
            try:
                host = model.infer({"x": cupy.asnumpy(x)})["y"]
                if not np.array_equal(host, cupy.asnumpy(x)):
                    checks[size] += "; host round trip WRONG DATA"
            except Exception as exc:
                checks[size] += f"; host round trip FAILED: {type(exc).__name__}: {exc}"
            log(f"  {size:>4} MiB check: {checks[size]}")
            for way, call in ways_for(x).items():
                try:
                    warm = timed_calls(call, sync, 3)
                except Exception as exc:
                    errors[size][way] = f"{type(exc).__name__}: {exc}"
                    log(f"  {size:>4} MiB {way}: FAILED: {errors[size][way]}")
                    continue
                iterations[size][way] = max(3, min(500, int(seconds * 1e6 / max(min(warm), 1.0))))

        for r in range(rounds):
            for size in sizes:
                for way, call in ways_for(inputs[size]).items():
                    if way in errors[size]:
                        continue
                    try:
                        samples[size][way].append(statistics.median(timed_calls(call, sync, iterations[size][way])))
                    except Exception as exc:
                        errors[size][way] = f"{type(exc).__name__}: {exc}"
            log(f"  round {r + 1}/{rounds} done ({time.perf_counter() - started:.1f} s)")
        del inputs

    def median(size: int, way: str) -> float | None:
        values = samples[size][way]
        return statistics.median(values) if values else None

    def us(value: float | None) -> str:
        return "—" if value is None else f"{value:,.1f} µs"

    def ratio(a: float | None, b: float | None) -> str:
        return "—" if a is None or b is None else f"{a / b:,.2f}x"

    def rate(size: int, value: float | None) -> str:
        return "—" if value is None else f"{size * MIB / value / 1e3:,.1f} GB/s"

    print(f"\nidentity model, cupy float32, {gpu_name}; medians of {rounds} interleaved rounds\n")
    print(
        "| size | zero-copy (GPU in, GPU out) | D2D copy floor | zero-copy ÷ floor | zero-copy rate "
        "| host round trip | host ÷ zero-copy |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for size in sizes:
        zc, fl, host = (median(size, way) for way in WAYS)
        print(
            f"| {size} MiB | {us(zc)} | {us(fl)} | {ratio(zc, fl)} | {rate(size, zc)} | {us(host)} | {ratio(host, zc)} |"
        )
        rows.append(
            {
                "size_mib": size,
                "zero_copy_us": zc,
                "floor_us": fl,
                "host_round_trip_us": host,
                "check": checks.get(size),
                "errors": errors[size],
                "iterations": iterations[size],
            }
        )
    for size in sizes:
        for way, error in errors[size].items():
            print(f"\n{size} MiB {way} failed: {error}")
    bad = [size for size in sizes if not checks.get(size, "").startswith("ok") or errors[size]]
    print(f"\nchecks: {'all ok' if not bad else 'FAILED for ' + ', '.join(f'{s} MiB' for s in bad)}")
    print(f"total {time.perf_counter() - started:.1f} s")
    try:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {"gpu": gpu_name, "cupy": cupy.__version__, "python": platform.python_version(), "rounds": rounds}
        args.json.write_text(json.dumps({**meta, "rows": rows}, indent=2))
    except OSError as exc:
        log(f"could not write {args.json}: {exc}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
