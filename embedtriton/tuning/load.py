"""The load a tuning run sends: requests built from the model's own tensor declarations (random
data of the declared dtype and shape) or from the user's samples, and how one configuration is
measured under it at one concurrency: in process (asyncio, many requests in flight) or over
the gRPC endpoint with perf_analyzer."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import re
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Tensor
from ..config.tensor import name_of
from ..errors import InvalidArgumentError, TritonError, UnavailableError

POOL = 64  # distinct random requests cycled through (so that the response cache never helps them)


class Load:
    """Request inputs for one model: ``request(i)`` is the i-th request's inputs (one row)."""

    def __init__(
        self,
        inputs: Sequence[Tensor],
        batched: bool,
        shapes: Mapping[str, Sequence[int]] | None = None,
        samples: Mapping[str, np.ndarray] | None = None,
        seed: int = 0,
    ) -> None:
        self.batched = batched
        self.shapes: dict[str, tuple[int, ...]] = {}  # each input's shape without the batch axis
        shapes = dict(shapes or {})
        unknown = sorted(set(shapes) - {name_of(t) for t in inputs})
        if unknown:
            raise InvalidArgumentError(f"--shape names {unknown}, which are not inputs of the model")
        for t in inputs:
            name = name_of(t)
            given: tuple[int, ...] = tuple(shapes.get(name, ()))
            if given:
                if len(given) != len(t.shape) or any(d != g for d, g in zip(t.shape, given, strict=True) if d != -1):
                    raise InvalidArgumentError(
                        f"--shape {t.name}={','.join(map(str, given))} does not fit its declared shape {list(t.shape)} "
                        "(give every dimension, without the batch axis)"
                    )
                self.shapes[name] = given
            else:
                self.shapes[name] = tuple(1 if d == -1 else d for d in t.shape)
        self.repeats = samples is not None  # samples are cycled: the same inputs come again
        if samples is not None:
            self.pool = _from_samples(inputs, samples, batched)
        else:
            rng = np.random.default_rng(seed)
            batch_axis: tuple[int, ...] = (1,) if batched else ()
            self.pool = [
                {name_of(t): _random(rng, t, batch_axis + self.shapes[name_of(t)]) for t in inputs} for _ in range(POOL)
            ]

    def request(self, i: int) -> dict[str, np.ndarray]:
        return self.pool[i % len(self.pool)]

    def unique(self) -> int:
        return len(self.pool)


def _random(rng: np.random.Generator, tensor: Tensor, shape: tuple[int, ...]) -> np.ndarray:
    dtype = np.dtype(tensor.dtype)
    if dtype.kind in "SUO":
        letters = rng.integers(97, 123, size=(math.prod(shape), 8), dtype=np.uint8)
        return np.array([bytes(row) for row in letters], dtype=np.object_).reshape(shape)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(0, 100, size=shape).astype(dtype)
    return rng.standard_normal(size=shape).astype(dtype)


def _from_samples(inputs: Sequence[Tensor], samples: Mapping[str, np.ndarray], batched: bool) -> list[dict]:
    names = [name_of(t) for t in inputs]
    missing = sorted(set(names) - set(samples))
    if missing:
        raise InvalidArgumentError(
            f"the samples have no {missing}: give one array per input, its first axis the samples (inputs: {names})"
        )
    counts = {len(samples[n]) for n in names}
    if len(counts) != 1 or 0 in counts:
        raise InvalidArgumentError(f"the samples' arrays must hold the same number (> 0) of samples, not {counts}")
    (count,) = counts
    return [{n: np.ascontiguousarray(samples[n][i : i + 1] if batched else samples[n][i]) for n in names}
            for i in range(count)]  # fmt: skip


@dataclass
class Measure:
    """One configuration at one concurrency."""

    concurrency: int
    throughput: float  # infer/s
    p50_ms: float
    p95_ms: float
    p99_ms: float
    queue_us: float  # Triton's average queue time per request in the window
    compute_us: float  # ... and compute (input + infer + output)
    errors: int


def measure_in_process(model: Any, load: Load, concurrency: int, seconds: float, warmup: float = 0.2) -> Measure:
    """``concurrency`` callers each send their next request when the last is answered, for a
    warm-up, then ``seconds`` measured (on an event loop of its own thread)."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="embedtriton-tune") as pool:
        return pool.submit(asyncio.run, _drive(model, load, concurrency, seconds, warmup)).result()


async def _drive(model: Any, load: Load, concurrency: int, seconds: float, warmup: float) -> Measure:
    latencies: list[float] = []
    state = {"measuring": False, "stop": False, "errors": 0}

    async def caller(k: int) -> None:
        i = k
        while not state["stop"]:
            inputs = load.request(i)
            i += concurrency
            started = time.perf_counter()
            try:
                await model.infer_async(inputs)
            except TritonError:
                state["errors"] += 1
                await asyncio.sleep(0.001)
                continue
            if state["measuring"]:
                latencies.append(time.perf_counter() - started)

    tasks = [asyncio.ensure_future(caller(k)) for k in range(concurrency)]
    try:
        await asyncio.sleep(warmup)
        before = model.statistics()["inference_stats"]
        state["measuring"] = True
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        state["measuring"] = False
        elapsed = time.perf_counter() - started
        after = model.statistics()["inference_stats"]
    finally:
        state["stop"] = True
        await asyncio.gather(*tasks, return_exceptions=True)
    ms = np.array(latencies) * 1e3
    percentiles = tuple(float(np.percentile(ms, q)) for q in (50, 95, 99)) if len(ms) else (math.inf,) * 3
    return _summary(concurrency, len(latencies) / elapsed, percentiles, before, after, state["errors"])


def _summary(
    concurrency: int, throughput: float, percentiles: Sequence[float], before: dict, after: dict, errors: int
) -> Measure:
    """A Measure from throughput, (p50, p95, p99) in ms and Triton's statistics before and after."""

    def mean_us(*keys: str) -> float:
        count = after["success"]["count"] - before["success"]["count"]
        ns = sum(int(after[k]["ns"]) - int(before[k]["ns"]) for k in keys)
        return ns / count / 1e3 if count else 0.0

    p50, p95, p99 = percentiles
    return Measure(concurrency, throughput, p50, p95, p99, mean_us("queue"),
                   mean_us("compute_input", "compute_infer", "compute_output"), errors)  # fmt: skip


def measure_grpc(
    model: Any, load: Load, concurrency: int, seconds: float, binary: str, env: dict[str, str], address: str
) -> Measure:
    """The same, driven by perf_analyzer over our gRPC endpoint at ``address``."""
    shapes = [arg for name, shape in load.shapes.items() for arg in ("--shape", f"{name}:{','.join(map(str, shape))}")]
    cmd = [binary, "-m", model.name, "-i", "grpc", "-u", address, "--concurrency-range", str(concurrency),
           "--measurement-interval", str(max(100, int(seconds * 1000))), "--stability-percentage", "1000",
           "--max-trials", "3", "--percentile", "99", *shapes]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="embedtriton-tune-") as folder:
        if load.repeats:  # the samples themselves, cycled through as in process
            data = Path(folder) / "samples.json"
            data.write_text(json.dumps({"data": [_as_json(sample, load.batched) for sample in load.pool]}))
            cmd += ["--input-data", str(data)]
        before = model.statistics()["inference_stats"]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(120, 20 * seconds))
        after = model.statistics()["inference_stats"]
    found = {k: re.search(rf"{k} latency: (\d+) usec", run.stdout) for k in ("p50", "p95", "p99")}
    throughput = re.search(r"Throughput: ([\d.]+) infer/sec", run.stdout)
    if run.returncode != 0 or throughput is None or not all(found.values()):
        raise UnavailableError(f"perf_analyzer failed:\n{run.stdout[-1500:]}\n{run.stderr[-1500:]}")
    percentiles = [int(found[k].group(1)) / 1e3 for k in ("p50", "p95", "p99")]  # type: ignore[union-attr]
    return _summary(concurrency, float(throughput.group(1)), percentiles, before, after, 0)


def _as_json(sample: Mapping[str, np.ndarray], batched: bool) -> dict[str, Any]:
    """One request in perf_analyzer's --input-data layout (shapes without the batch axis)."""
    entry = {}
    for name, value in sample.items():
        row = value[0] if batched else value
        flat = row.reshape(-1)
        if flat.dtype.kind in "OSU":
            content = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat]
        else:
            content = flat.tolist()
        entry[name] = {"content": content, "shape": list(row.shape)}
    return entry


def read_samples(path: str) -> dict[str, np.ndarray]:
    """``--samples file.npz``: one array per input, its first axis the samples."""
    try:
        with np.load(Path(path), allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"cannot read the samples {path!r}: {exc}") from None


def parse_shapes(items: Sequence[str]) -> dict[str, list[int]]:
    """``--shape name=d1,d2``: an input's dimensions without the batch axis."""
    shapes = {}
    for item in items:
        name, _, dims = item.partition("=")
        try:
            shapes[name.strip()] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise InvalidArgumentError(f"--shape {item!r}: expected NAME=D1[,D2...], e.g. x=16,3") from None
        if not name.strip() or any(d <= 0 for d in shapes[name.strip()]):
            raise InvalidArgumentError(f"--shape {item!r}: expected NAME=D1[,D2...] with positive dimensions")
    return shapes
