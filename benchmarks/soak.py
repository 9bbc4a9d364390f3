"""Soak: 256 requests in flight for a while, in process and over gRPC; nothing lost, all correct.

    python benchmarks/soak.py [--seconds 30] [--in-flight 256]

Phase 1 drives AddSub in process (asyncio, ``infer_async``); phase 2 drives the same
server over its gRPC endpoint from a separate client process (tritonclient's asyncio
client). Each request carries its own random inputs and its answer is checked. Prints, per
phase: sent, answered, correct, errors, requests/s, and the server's RSS at the start and
the end of the phase. Exits non-zero if a request was lost or wrong. ``nox -s soak`` runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

import numpy as np

from embedtriton import DynamicBatcher, ModelConfig, Server, Tensor, TritonError, batch

F32 = np.float32


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@batch
def add_sub(a, b):
    return {"add": a + b, "sub": a - b}


def make_server() -> Server:
    server = Server()
    server.bind(
        "AddSub",
        add_sub,
        [Tensor(name="a", dtype=F32, shape=(4,)), Tensor(name="b", dtype=F32, shape=(4,))],
        [Tensor(name="add", dtype=F32, shape=(4,)), Tensor(name="sub", dtype=F32, shape=(4,))],
        ModelConfig(max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=100)),
    )
    return server


WARM_S = 5.0  # the RSS sampled this long into a phase, once allocators and queues have filled


async def drive(seconds: float, in_flight: int, call, samples: list[float] | None = None) -> dict[str, int]:
    """Keep ``in_flight`` requests going for ``seconds``; ``call(a, b)`` returns (add, sub).
    With ``samples``: this process's RSS is appended WARM_S seconds in."""
    counts = {"sent": 0, "answered": 0, "correct": 0, "errors": 0}
    deadline = time.monotonic() + seconds

    async def sample() -> None:
        await asyncio.sleep(min(WARM_S, seconds / 3))
        samples.append(rss_mib())

    rng = np.random.default_rng(0)

    async def worker() -> None:
        while time.monotonic() < deadline:
            a = rng.random((1, 4), dtype=F32)
            b = rng.random((1, 4), dtype=F32)
            counts["sent"] += 1
            try:
                add, sub = await call(a, b)
            except Exception as exc:  # noqa: BLE001 - counted, and the first few printed
                counts["errors"] += 1
                if counts["errors"] <= 3:
                    print(f"  error: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            counts["answered"] += 1
            counts["correct"] += bool(np.array_equal(add, a + b) and np.array_equal(sub, a - b))

    extra = [sample()] if samples is not None else []
    await asyncio.gather(*(worker() for _ in range(in_flight)), *extra)
    return counts


async def grpc_client(address: str, seconds: float, in_flight: int) -> dict[str, int]:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(address)

    async def call(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inputs = [grpcclient.InferInput("a", [1, 4], "FP32"), grpcclient.InferInput("b", [1, 4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = await client.infer("AddSub", inputs)
        return result.as_numpy("add"), result.as_numpy("sub")

    try:
        return await drive(seconds, in_flight, call)
    finally:
        await client.close()


def report(name: str, counts: dict[str, int], seconds: float, rss: tuple[float, float, float]) -> bool:
    ok = counts["sent"] == counts["answered"] == counts["correct"] and not counts["errors"]
    print(
        f"| {name} | {counts['sent']:,} | {counts['answered']:,} | {counts['correct']:,} | {counts['errors']} | "
        f"{counts['sent'] / seconds:,.0f} | {rss[0]:.1f} → {rss[1]:.1f} → {rss[2]:.1f} MiB | "
        f"{'ok' if ok else 'LOST OR WRONG'} |",
        flush=True,
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase (default 30)")
    parser.add_argument("--in-flight", type=int, default=256, help="requests in flight (default 256)")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # internal: run as the gRPC client of ADDRESS
    args = parser.parse_args()
    if args.client:
        print(json.dumps(asyncio.run(grpc_client(args.client, args.seconds, args.in_flight))))
        return 0

    server = make_server()
    with server:
        model = server.model("AddSub")
        port = server.serve_grpc("127.0.0.1:0")
        model.infer({"a": np.zeros((1, 4), F32), "b": np.zeros((1, 4), F32)})  # warm
        print(f"soak: {args.in_flight} in flight, {args.seconds:.0f} s per phase", flush=True)
        print(f"| phase | sent | answered | correct | errors | req/s | server RSS start → {WARM_S:.0f} s → end | |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)

        async def in_process(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            out = await model.infer_async({"a": a, "b": b})
            return out["add"], out["sub"]

        start, warm = rss_mib(), []
        counts = asyncio.run(drive(args.seconds, args.in_flight, in_process, warm))
        ok = report("in process", counts, args.seconds, (start, warm[0], rss_mib()))

        start = rss_mib()
        command = [sys.executable, __file__, "--client", f"127.0.0.1:{port}", "--seconds", str(args.seconds)]
        child = subprocess.Popen(
            [*command, "--in-flight", str(args.in_flight)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        time.sleep(min(WARM_S, args.seconds / 3) + 1.0)  # the client needs about a second to start
        warm_rss = rss_mib()
        out, err = child.communicate()
        if child.returncode != 0:
            print(err, file=sys.stderr)
            return 1
        counts = json.loads(out.strip().splitlines()[-1])
        ok = report("gRPC", counts, args.seconds, (start, warm_rss, rss_mib())) and ok
        try:
            model.infer({"a": np.ones((1, 4), F32), "b": np.ones((1, 4), F32)})
        except TritonError as exc:
            print(f"the server stopped answering: {exc}", file=sys.stderr)
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
