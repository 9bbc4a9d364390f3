"""Continuous batching behind OpenAI's chat route: the batch-step binding (``bind_chat(server,
name, step=fn)``) against the per-request binding (``bind_chat(server, name, fn)``, 8 instances)
of the same model, at 1, 8 and 32 concurrent streaming clients.

Two models, each bound both ways in a server process:

- ``cost``: a stand-in for one accelerator: a forward pass holds one lock for ``A_MS + B_MS *
  batch`` ms (a sleep), whichever binding calls it; the per-request binding's instances queue
  for it one token at a time, the batch-step one makes a token for every sequence per pass;
- ``tiny``: the real transformer of ``examples/llm_continuous.py`` (numpy, 4 layers of 256, a
  KV cache per sequence), decoding its batch in one pass, or one sequence per pass.

Clients are asyncio tasks in this process (raw HTTP/1.1, ``stream: true``, Server-Sent Events),
each asking one answer after another with ``max_tokens`` drawn from an exponential distribution
(mean 24, 1 to 96; the same draws for both bindings). Prints output tokens/s and time to first
token (p50, p99) per cell, the median of ``--repeats`` interleaved rounds, and the ratio of the
batch-step binding to the per-request one.

    python benchmarks/bench_llm.py [--repeats 3] [--answers 2]
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
from pathlib import Path

import numpy as np

A_MS, B_MS = 4.0, 0.1  # the cost model's forward pass: A_MS + B_MS per sequence in the batch
CONCURRENCY = (1, 8, 32)
MEAN_TOKENS = 24


def serve() -> None:
    """The server process: both models bound both ways, on an ephemeral HTTP port, until SIGTERM."""
    import threading

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import llm_continuous as example

    from embedtriton import Server
    from embedtriton.openai import bind_chat

    accelerator = threading.Lock()

    def forward(batch: int) -> None:
        with accelerator:
            time.sleep((A_MS + B_MS * batch) / 1000)

    def cost_step(seqs):
        forward(len(seqs))
        return ["x"] * len(seqs)

    def cost_alone(messages, **params):
        for _ in range(int(params.get("max_tokens") or 16)):
            forward(1)
            yield "x"

    server = Server()
    bind_chat(server, "cost-step", step=cost_step, max_sequences=32)
    bind_chat(server, "cost-alone", cost_alone)
    bind_chat(server, "tiny-step", step=example.step, max_sequences=32)
    bind_chat(server, "tiny-alone", example.generate)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server:
        print(server.serve_http("127.0.0.1:0", openai=True), flush=True)
        stop.wait()


async def one_answer(port: int, model: str, tokens: int) -> tuple[float, int]:
    """(time to first token, tokens) of one streamed chat answer."""
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": True}
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.perf_counter()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    first, got = None, 0
    async for line in reader:
        if not line.startswith(b"data: {"):
            continue
        choices = json.loads(line[6:]).get("choices") or [{}]
        if (choices[0].get("delta") or {}).get("content"):
            got += 1
            if first is None:
                first = time.perf_counter() - started
    writer.close()
    return (first if first is not None else float("nan")), got


async def round_of(port: int, model: str, clients: int, lengths: list[int]) -> dict[str, float]:
    """Every client streams its share of ``lengths``, one answer after another."""
    ttfts: list[float] = []
    total = [0]

    async def client(mine: list[int]) -> None:
        for n in mine:
            ttft, got = await one_answer(port, model, n)
            ttfts.append(ttft)
            total[0] += got

    started = time.perf_counter()
    await asyncio.gather(*(client(lengths[i::clients]) for i in range(clients)))
    elapsed = time.perf_counter() - started
    assert total[0] == sum(lengths), (model, total[0], sum(lengths))
    return {
        "tok_s": total[0] / elapsed,
        "ttft_p50": 1000 * float(np.percentile(ttfts, 50)),
        "ttft_p99": 1000 * float(np.percentile(ttfts, 99)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--answers", type=int, default=2, help="answers per client per round")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    child = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        rng = np.random.default_rng(0)
        cells: dict[tuple[str, int, str], list[dict[str, float]]] = {}
        for model in ("cost", "tiny"):
            for clients in CONCURRENCY:
                lengths = [int(x) for x in np.clip(rng.exponential(MEAN_TOKENS, clients * args.answers), 1, 96)]
                asyncio.run(round_of(port, f"{model}-step", clients, lengths[:clients]))  # (warm-up)
                for _ in range(args.repeats):  # interleaved: the two bindings see the same load
                    for form in ("alone", "step"):
                        result = asyncio.run(round_of(port, f"{model}-{form}", clients, lengths))
                        cells.setdefault((model, clients, form), []).append(result)
                print(f"  {model} at {clients} clients done", file=sys.stderr, flush=True)
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(30)

    def median(model: str, clients: int, form: str, key: str) -> float:
        return statistics.median(r[key] for r in cells[model, clients, form])

    print(f"\nbatch-step vs per-request binding, medians of {args.repeats} interleaved rounds")
    print(f"{'model':6} {'clients':>7} | {'tok/s per-req':>13} {'tok/s step':>10} {'ratio':>6} | "
          f"{'TTFT p50 per-req':>16} {'step':>7} {'ratio':>6} | {'TTFT p99 per-req':>16} {'step':>7}")  # fmt: skip
    for model in ("cost", "tiny"):
        for clients in CONCURRENCY:
            a, s = (median(model, clients, f, "tok_s") for f in ("alone", "step"))
            p50a, p50s = (median(model, clients, f, "ttft_p50") for f in ("alone", "step"))
            p99a, p99s = (median(model, clients, f, "ttft_p99") for f in ("alone", "step"))
            print(f"{model:6} {clients:>7} | {a:>13,.0f} {s:>10,.0f} {s / a:>5.2f}x | "
                  f"{p50a:>13.1f} ms {p50s:>4.1f} ms {p50s / p50a:>5.2f}x | {p99a:>13.1f} ms {p99s:>4.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
