"""Continuous batching behind OpenAI's chat route: the batch-step binding (``bind_chat(server,
name, step=fn)``) against the per-request binding (``bind_chat(server, name, fn)``, 8 instances)
of the same model, at 1, 8 and 32 concurrent streaming clients.

Two models, each bound both ways in a server process:

- ``cost``: a stand-in for one accelerator: a forward pass holds one lock for ``A_MS + B_MS *
  batch`` ms (a sleep), whichever binding calls it; the per-request binding's instances queue
  for it one token at a time, the batch-step one makes a token for every sequence per pass;
- ``tiny``: the real transformer of ``examples/llm_continuous.py`` (numpy, 4 layers of 256, a
  KV cache per sequence), decoding its batch in one pass, or one sequence per pass.

With ``litserve`` installed, a third server process serves the same step functions with
LitServe's ``ContinuousBatchingLoop`` (``add_request`` / ``has_capacity`` / ``step``, 32 sequences
at most, its own streaming route), the peer to beat.

Clients are asyncio tasks in this process (raw HTTP/1.1, ``stream: true``, Server-Sent Events),
each asking one answer after another with ``max_tokens`` drawn from an exponential distribution
(mean 24, 1 to 96; the same draws for both bindings). Prints output tokens/s and time to first
token (p50, p99) per cell, the median of ``--repeats`` interleaved rounds, and the ratio of the
batch-step binding to the per-request one (and to LitServe's loop).

    python benchmarks/bench_llm.py [--repeats 3] [--answers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

A_MS, B_MS = 4.0, 0.1  # the cost model's forward pass: A_MS + B_MS per sequence in the batch
CONCURRENCY = (1, 8, 32)
MEAN_TOKENS = 24


def serve() -> None:
    """The server process: both models bound both ways, on an ephemeral HTTP port, until SIGTERM."""
    sys.path.insert(0, EXAMPLES)
    import llm_continuous as example

    from embedtriton import Server
    from embedtriton.openai import bind_chat

    def cost_alone(messages, **params):
        for _ in range(int(params.get("max_tokens") or 16)):
            cost_step([None])
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


EXAMPLES = str(Path(__file__).resolve().parent.parent / "examples")
_accelerator = threading.Lock()  # (the cost model's, per process)


def cost_step(seqs: list) -> list[str]:
    """The cost model's batch-step function: one forward pass for the batch."""
    with _accelerator:
        time.sleep((A_MS + B_MS * len(seqs)) / 1000)
    return ["x"] * len(seqs)


def serve_litserve(port: int) -> None:
    """LitServe's ContinuousBatchingLoop serving the same two step functions (``/cost`` and
    ``/tiny``, streaming a JSON line per token), 32 sequences at most."""
    import litserve as ls

    apis = [LitStepAPI("cost"), LitStepAPI("tiny")]
    ls.LitServer(apis, accelerator="cpu").run(port=port, log_level="error", generate_client_file=False)


if importlib.util.find_spec("litserve") is not None:
    import litserve as ls
    from litserve.loops.continuous_batching_loop import ContinuousBatchingLoop, Output
    from litserve.utils import LitAPIStatus

    class LitStepAPI(ls.LitAPI):
        """add_request / has_capacity / step: LitServe's continuous batching over a step function
        of embedtriton.openai.Sequence objects (the same functions the batch-step binding calls)."""

        def __init__(self, name: str) -> None:
            super().__init__(max_batch_size=32, stream=True, loop=ContinuousBatchingLoop(), api_path=f"/{name}")
            self.name = name
            self.active: dict = {}

        def setup(self, device):
            if self.name == "tiny":
                sys.path.insert(0, EXAMPLES)
                import llm_continuous

                self.fn = llm_continuous.step
            else:
                self.fn = cost_step

        def decode_request(self, request):
            return request

        def add_request(self, uid, request):
            from embedtriton.openai import Sequence

            seq = Sequence(request["messages"], None, {"max_tokens": request["max_tokens"]})
            self.active[uid] = (seq, [int(request["max_tokens"])])

        def has_capacity(self):
            return len(self.active) < self.max_batch_size

        def has_active_requests(self):
            return bool(self.active)

        def step(self, prev_outputs):
            uids = list(self.active)
            seqs = [self.active[u][0] for u in uids]
            pieces = self.fn(seqs)
            outputs = []
            for uid, seq, piece in zip(uids, seqs, pieces, strict=True):
                seq.new = False
                left = self.active[uid][1]
                left[0] -= 1
                outputs.append(Output(uid, getattr(piece, "text", piece), LitAPIStatus.OK))  # (str or Chunk)
                if left[0] <= 0:
                    outputs.append(Output(uid, "", LitAPIStatus.FINISH_STREAMING))
                    del self.active[uid]
            return outputs

        def encode_response(self, output):
            return {"text": output}


async def one_answer(port: int, model: str, tokens: int) -> tuple[float, int]:
    """(time to first token, tokens) of one streamed chat answer (``litserve-<name>``: from the
    LitServe process, a JSON line per token)."""
    lit = model.startswith("litserve-")
    messages = [{"role": "user", "content": "hi"}]
    if lit:
        path, body = f"/{model.split('-')[1]}", json.dumps({"messages": messages, "max_tokens": tokens})
    else:
        path = "/v1/chat/completions"
        body = json.dumps({"model": model, "messages": messages, "max_tokens": tokens, "stream": True})
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.perf_counter()
    writer.write(
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body.encode())
    )
    first, got = None, 0
    async for line in reader:
        if lit:  # (bytes checks for both: the client's cost is the same whoever serves)
            made = line.startswith(b'{"text": "') and not line.startswith(b'{"text": ""')
        else:
            made = line.startswith(b"data: {") and b'"content": "' in line and b'"content": ""' not in line
        if made:
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--answers", type=int, default=2, help="answers per client per round")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-litserve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    if args.serve_litserve:
        serve_litserve(args.serve_litserve)
        return
    forms = ["alone", "step"]
    children = [subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)]
    lit_port = None
    if importlib.util.find_spec("litserve") is not None:
        lit_port = free_port()
        # (its own process group: stopped while the others are measured, since LitServe's idle
        # workers each keep a core busy, and the machine has two)
        lit = subprocess.Popen([sys.executable, __file__, "--serve-litserve", str(lit_port)], start_new_session=True)
        children.append(lit)
        forms.append("litserve")
    else:
        print("(litserve is not installed: `pip install litserve` adds its ContinuousBatchingLoop)", file=sys.stderr)
    try:
        port = int(children[0].stdout.readline())
        if lit_port is not None:
            wait_listening(lit_port)
        rng = np.random.default_rng(0)
        cells: dict[tuple[str, int, str], list[dict[str, float]]] = {}
        for model in ("cost", "tiny"):
            for clients in CONCURRENCY:
                lengths = [int(x) for x in np.clip(rng.exponential(MEAN_TOKENS, clients * args.answers), 1, 96)]
                for form in forms:  # (warm-up)
                    with running(children, form):
                        asyncio.run(round_of(*where(port, lit_port, model, form), clients, lengths[:clients]))
                for _ in range(args.repeats):  # interleaved: the forms see the same load
                    for form in forms:
                        with running(children, form):
                            result = asyncio.run(round_of(*where(port, lit_port, model, form), clients, lengths))
                        cells.setdefault((model, clients, form), []).append(result)
                print(f"  {model} at {clients} clients done", file=sys.stderr, flush=True)
    finally:
        children[0].send_signal(signal.SIGTERM)
        if len(children) > 1:
            os.killpg(children[1].pid, signal.SIGINT)
        for child in children:
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
        if len(children) > 1:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(children[1].pid, signal.SIGKILL)  # (LitServe's workers, if any are left)

    def median(model: str, clients: int, form: str, key: str) -> float:
        return statistics.median(r[key] for r in cells[model, clients, form])

    print(f"\noutput tokens/s and time to first token (TTFT), medians of {args.repeats} interleaved rounds")
    head = f"{'model':6} {'clients':>7} | {'per-request':>11} {'batch-step':>10} {'ratio':>6}"
    if lit_port is not None:
        head += f" | {'LitServe':>8} {'step/Lit':>8}"
    print(head + f" | {'TTFT p50 per-req':>16} {'step':>8} {'ratio':>6} | {'TTFT p99 per-req':>16} {'step':>8}")
    for model in ("cost", "tiny"):
        for clients in CONCURRENCY:
            a, s = (median(model, clients, f, "tok_s") for f in ("alone", "step"))
            row = f"{model:6} {clients:>7} | {a:>11,.0f} {s:>10,.0f} {s / a:>5.2f}x"
            if lit_port is not None:
                lit = median(model, clients, "litserve", "tok_s")
                row += f" | {lit:>8,.0f} {s / lit:>7.2f}x"
            p50a, p50s = (median(model, clients, f, "ttft_p50") for f in ("alone", "step"))
            p99a, p99s = (median(model, clients, f, "ttft_p99") for f in ("alone", "step"))
            print(row + f" | {p50a:>13.1f} ms {p50s:>5.1f} ms {p50s / p50a:>5.2f}x | {p99a:>13.1f} ms {p99s:>5.1f} ms")


@contextlib.contextmanager
def running(children: list[subprocess.Popen], form: str) -> Iterator[None]:
    """LitServe's processes run only while its own rounds do (SIGSTOP / SIGCONT to its group)."""
    if len(children) < 2 or form == "litserve":
        yield
        return
    os.killpg(children[1].pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(children[1].pid, signal.SIGCONT)


def where(port: int, lit_port: int | None, model: str, form: str) -> tuple[int, str]:
    """(port, model name) of a model in one form."""
    if form == "litserve":
        assert lit_port is not None
        return lit_port, f"litserve-{model}"
    return port, f"{model}-{form}"


if __name__ == "__main__":
    main()
