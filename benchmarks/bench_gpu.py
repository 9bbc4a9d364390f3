"""GPU tensors through an identity model: the zero-copy path against a host round trip, with a
plain device-to-device copy as the floor, all measured in the same run (needs a CUDA GPU and cupy).

For cupy float32 tensors from 64 KiB to 256 MiB, three ways, in interleaved rounds:

- zero-copy: ``model.infer({"x": cupy_array}, output_device="gpu")``. The input reaches the
  callable as the caller's own device memory, the callable returns it, the backend copies it
  device to device into Triton's output buffer (GPU memory from our response allocator) and the
  caller gets a DLPack-capable device array; the clock stops after a device synchronize;
- floor: ``y = x.copy()`` in cupy plus a device synchronize (one device-to-device copy, the least
  the zero-copy path must do since the output is a new buffer);
- host round trip, for contrast: ``cupy.asnumpy(x)`` -> ``infer`` with numpy -> ``cupy.asarray``
  of the output, what a host-only server makes a GPU application do.

``--stages`` adds the ways that split the zero-copy time into its parts (differences of medians
measured in the same rounds):

- host call: ``infer`` of one float on the host (what any in-process call costs);
- input only: the cupy input in, a constant one-float host output (the input's hand-over:
  DLPack export, Triton's GPU input, the callable's cupy array);
- output only: one float in, the callable returns a cupy array of the size that it keeps, the
  output on the GPU (the response allocator's device block, the device-to-device copy and its
  synchronize, the DeviceArray);
- CUDA calls: what the output's CUDA calls cost alone, made from cupy: ``mallocAsync`` on the
  legacy stream, a synchronize, ``memcpyAsync`` device to device, a synchronize, ``freeAsync``;
- copy + sync: ``memcpyAsync`` and one synchronize, with no allocation.

Each size is checked once (the output equals the input, through ``cupy.from_dlpack``). Prints a
markdown table of medians (per round, the median of the round's calls; then the median of the
rounds) with ratios to the floor, and writes benchmarks/results/gpu_zero_copy.json (or --json).

    python benchmarks/bench_gpu.py [--quick] [--stages] [--rounds 5] [--sizes 64K,1M,4M,16M,64M,256M]

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
STAGES = ("host call", "input only", "output only", "CUDA calls", "copy + sync")


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


def parse_size(text: str) -> int:
    """Bytes of "64K", "4M", "1G" or a plain number of MiB ("16")."""
    text = text.strip().upper()
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(float(text) * MIB)


def size_label(size: int) -> str:
    return f"{size // MIB} MiB" if size % MIB == 0 else f"{size // 2**10} KiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and calls (a smoke check)")
    parser.add_argument("--stages", action="store_true", help="also the ways that split the zero-copy time")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5, --quick 2)")
    parser.add_argument(
        "--sizes", default="64K,256K,1M,4M,16M,64M,256M", help="tensor sizes (64K, 4M, 1G; a plain number is MiB)"
    )
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
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    ways = WAYS + (STAGES if args.stages else ())

    cupy, why = gpu_or_reason()
    if cupy is None:
        print(f"gpu_zero_copy: needs a CUDA GPU and cupy; skipped: {why}")
        return 0

    from embedtriton import ModelConfig, Server, ServerConfig, Tensor

    device = cupy.cuda.Device()
    sync = device.synchronize
    runtime = cupy.cuda.runtime
    props = runtime.getDeviceProperties(device.id)
    gpu_name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    one_host = np.ones(1, np.float32)
    kept: dict[int, object] = {}  # the output-only model's outputs, one per size, made once

    def identity(requests):
        return [{"y": r["x"]} for r in requests]

    def sink(requests):  # input only: the cupy input in, a constant host float out
        return [{"y": one_host} for _ in requests]

    def source(requests):  # output only: one float in (the size's index), a kept cupy array out
        return [{"y": kept[sizes[int(r["x"][0])]]} for r in requests]

    server_config = ServerConfig(cuda_memory_pool_byte_size={0: args.cuda_pool_mib * MIB} if args.cuda_pool_mib else {})
    server = Server(server_config)
    vector = dict(
        inputs=[Tensor(name="x", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(batching=False, gpu_arrays="cupy"),
    )
    server.bind("identity", identity, **vector)
    server.bind("sink", sink, **vector)
    server.bind("source", source, **vector)

    log(
        f"gpu_zero_copy: {gpu_name}, cupy {cupy.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores; sizes {', '.join(map(size_label, sizes))}, {rounds} interleaved rounds of "
        f"~{seconds:.2f} s per way" + (f"; CUDA memory pool {args.cuda_pool_mib} MiB" if args.cuda_pool_mib else "")
    )
    started = time.perf_counter()
    samples: dict[int, dict[str, list[float]]] = {size: {way: [] for way in ways} for size in sizes}
    errors: dict[int, dict[str, str]] = {size: {} for size in sizes}
    checks: dict[int, str] = {}
    iterations: dict[int, dict[str, int]] = {size: {} for size in sizes}
    with server:
        model, sink_model, source_model = (server.model(name) for name in ("identity", "sink", "source"))
        inputs = {size: cupy.arange(size // 4, dtype=cupy.float32) for size in sizes}
        for size in sizes:
            kept[size] = inputs[size].copy()
        sync()

        def ways_for(size: int):
            x = inputs[size]
            index = np.array([sizes.index(size)], np.float32)
            nbytes = x.nbytes

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

            def host_call():
                model.infer({"x": one_host})

            def input_only():
                sink_model.infer({"x": x})

            def output_only():
                out = source_model.infer({"x": index}, output_device="gpu")
                del out

            def cuda_calls():
                ptr = runtime.mallocAsync(nbytes, 0)
                runtime.streamSynchronize(0)
                runtime.memcpyAsync(ptr, x.data.ptr, nbytes, runtime.memcpyDeviceToDevice, 0)
                runtime.streamSynchronize(0)
                runtime.freeAsync(ptr, 0)

            target = kept[size]

            def copy_sync():
                runtime.memcpyAsync(target.data.ptr, x.data.ptr, nbytes, runtime.memcpyDeviceToDevice, 0)
                runtime.streamSynchronize(0)

            every = {
                "zero-copy": zero_copy,
                "floor": floor,
                "host round trip": host_round_trip,
                "host call": host_call,
                "input only": input_only,
                "output only": output_only,
                "CUDA calls": cuda_calls,
                "copy + sync": copy_sync,
            }
            return {way: every[way] for way in ways}

        # once per size: correctness, warm-up, and how many calls fill `seconds`
        for size in sizes:
            x = inputs[size]
            label = size_label(size)
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
            if args.stages:
                try:
                    index = np.array([sizes.index(size)], np.float32)
                    made = cupy.from_dlpack(source_model.infer({"x": index}, output_device="gpu")["y"])
                    if not bool(cupy.array_equal(made, kept[size])):
                        checks[size] += "; output only WRONG DATA"
                except Exception as exc:
                    checks[size] += f"; output only FAILED: {type(exc).__name__}: {exc}"
            log(f"  {label:>8} check: {checks[size]}")
            for way, call in ways_for(size).items():
                try:
                    warm = timed_calls(call, sync, 3)
                except Exception as exc:
                    errors[size][way] = f"{type(exc).__name__}: {exc}"
                    log(f"  {label:>8} {way}: FAILED: {errors[size][way]}")
                    continue
                iterations[size][way] = max(3, min(500, int(seconds * 1e6 / max(min(warm), 1.0))))

        for r in range(rounds):
            for size in sizes:
                for way, call in ways_for(size).items():
                    if way in errors[size]:
                        continue
                    try:
                        samples[size][way].append(statistics.median(timed_calls(call, sync, iterations[size][way])))
                    except Exception as exc:
                        errors[size][way] = f"{type(exc).__name__}: {exc}"
            log(f"  round {r + 1}/{rounds} done ({time.perf_counter() - started:.1f} s)")
        inputs.clear()
        kept.clear()

    def median(size: int, way: str) -> float | None:
        values = samples[size].get(way)
        return statistics.median(values) if values else None

    def us(value: float | None) -> str:
        return "—" if value is None else f"{value:,.1f} µs"

    def ratio(a: float | None, b: float | None) -> str:
        return "—" if a is None or b is None else f"{a / b:,.2f}x"

    def rate(size: int, value: float | None) -> str:
        return "—" if value is None else f"{size / value / 1e3:,.1f} GB/s"

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
            f"| {size_label(size)} | {us(zc)} | {us(fl)} | {ratio(zc, fl)} | {rate(size, zc)} | {us(host)} "
            f"| {ratio(host, zc)} |"
        )
        rows.append(
            {
                "size_bytes": size,
                "size_mib": size / MIB,
                "zero_copy_us": zc,
                "floor_us": fl,
                "host_round_trip_us": host,
                "stages_us": {way: median(size, way) for way in STAGES if way in ways},
                "check": checks.get(size),
                "errors": errors[size],
                "iterations": iterations[size],
            }
        )
    if args.stages:
        print("\nwhere the zero-copy time goes (medians; the parts are differences of ways run in the same rounds)\n")
        print(
            "| size | zero-copy | host call | input only − host call | output only − host call | CUDA calls "
            "| copy + sync | floor |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for size in sizes:
            zc, call, inp, outp, cuda_calls, copy_sync, fl = (
                median(size, way)
                for way in ("zero-copy", "host call", "input only", "output only", "CUDA calls", "copy + sync", "floor")
            )

            def minus(a: float | None, b: float | None) -> float | None:
                return None if a is None or b is None else a - b

            print(
                f"| {size_label(size)} | {us(zc)} | {us(call)} | {us(minus(inp, call))} | {us(minus(outp, call))} "
                f"| {us(cuda_calls)} | {us(copy_sync)} | {us(fl)} |"
            )
    for size in sizes:
        for way, error in errors[size].items():
            print(f"\n{size_label(size)} {way} failed: {error}")
    bad = [size for size in sizes if not checks.get(size, "").startswith("ok") or errors[size]]
    print(f"\nchecks: {'all ok' if not bad else 'FAILED for ' + ', '.join(size_label(s) for s in bad)}")
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
