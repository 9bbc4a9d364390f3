"""OpenAI ``/v1/embeddings`` requests per second at 1 and 32 concurrent clients, with Triton's
dynamic batching on and off.

A server process binds one toy embedding function twice with ``bind_embedding``: ``batched``
(``max_batch_size=64``, the dynamic batcher without a queue delay: texts that arrive while a
batch runs form the next one) and ``single`` (``batching=False``: one text per call). The
function costs what a small encoder on an accelerator costs: a fixed 10 ms per call (a sleep,
standing in for a forward pass; ``BENCH_CALL_COST_S`` changes it) plus a numpy projection per
text. With no cost at all both measure the HTTP path and this client instead (350-450
requests/s on the two shared cores it was written on). Clients are asyncio tasks in this
process (raw HTTP/1.1 keep-alive connections, one text per request); each cell is the median
of ``--repeats`` interleaved rounds of ``--seconds`` each.

    python benchmarks/bench_openai.py [--repeats 3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import time

import numpy as np

CALL_COST_S = float(
    __import__("os").environ.get("BENCH_CALL_COST_S", "0.01")
)  # the fixed cost of one call of the embedding function
DIM = 384


def serve() -> None:
    """The server process: both embedding models on an ephemeral HTTP port until SIGTERM."""
    import threading

    from embedtriton import DynamicBatcher, ModelConfig, Server
    from embedtriton.openai import bind_embedding

    weights = np.random.default_rng(0).standard_normal((256, DIM)).astype(np.float32)

    def embed(texts: list[str]) -> np.ndarray:
        time.sleep(CALL_COST_S)
        counts = np.zeros((len(texts), 256), np.float32)
        for i, text in enumerate(texts):
            np.add.at(counts[i], np.frombuffer(text.encode(), np.uint8), 1.0)
        vectors = counts @ weights
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    server = Server()
    bind_embedding(server, "batched", embed, ModelConfig(max_batch_size=64, batcher=DynamicBatcher()))
    bind_embedding(server, "single", embed, ModelConfig(batching=False))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server:
        port = server.serve_http("127.0.0.1:0", openai=True)
        print(f"ready {port}", flush=True)
        stop.wait()


async def _client(port: int, model: str, until: float, counts: list[int], index: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    n = 0
    try:
        while time.perf_counter() < until:
            body = json.dumps({"model": model, "input": f"a sentence to embed, number {index}-{n}"}).encode()
            writer.write(
                b"POST /v1/embeddings HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            data = await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"{model}: {head.splitlines()[0]!r} {data[:200]!r}")
            n += 1
    finally:
        writer.close()
    counts[index] = n


def measure(port: int, model: str, clients: int, seconds: float) -> float:
    """Requests per second that ``clients`` concurrent clients get from ``model``."""

    async def run() -> float:
        counts = [0] * clients
        started = time.perf_counter()
        until = started + seconds
        await asyncio.gather(*(_client(port, model, until, counts, i) for i in range(clients)))
        return sum(counts) / (time.perf_counter() - started)

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline() if server.stdout else ""
        if not line.startswith("ready "):
            raise SystemExit(f"the server did not start: {line!r}")
        port = int(line.split()[1])
        cells = [(model, clients) for clients in (1, 32) for model in ("batched", "single")]
        for model, clients in cells:  # warm up
            measure(port, model, clients, 0.3)
        results: dict[tuple[str, int], list[float]] = {cell: [] for cell in cells}
        for _ in range(args.repeats):
            for cell in cells:  # interleaved: drift on a shared machine hits every cell alike
                results[cell].append(measure(port, *cell, args.seconds))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    median = {cell: statistics.median(values) for cell, values in results.items()}
    print(f"Embeddings over /v1/embeddings, one text per request, {CALL_COST_S * 1000:g} ms per call of the function")
    print(f"(medians of {args.repeats} interleaved rounds of {args.seconds:g} s)\n")
    print("| clients | batching on (req/s) | batching off (req/s) | on / off |")
    print("| ---: | ---: | ---: | ---: |")
    for clients in (1, 32):
        on, off = median[("batched", clients)], median[("single", clients)]
        print(f"| {clients} | {on:,.0f} | {off:,.0f} | {on / off:.1f}x |")


if __name__ == "__main__":
    main()
