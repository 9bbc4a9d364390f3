"""Continuous batching with an iterative sequence model: a toy token generator.

Each request asks for a different number of tokens. Triton's sequence batcher advances every
in-flight request by one token per scheduling iteration; a request that is done frees its
slot at once, and a new request joins at the next iteration instead of waiting for the
batch to drain. Tokens stream to each caller as they are made.

    python examples/continuous_batching.py
"""

from __future__ import annotations

import threading
import time

import numpy as np

from embedtriton import ModelConfig, SequenceBatcher, Server, Tensor

WORDS = ["lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit"]


def generate(request):
    """An iterative model's function takes one request and yields one output per step."""
    for step in range(int(request["max_tokens"][0, 0])):
        time.sleep(0.002)  # the "forward pass" for this token
        yield {"token": np.array([[WORDS[step % len(WORDS)].encode()]], dtype=object)}


def main() -> None:
    server = Server()
    server.bind(
        "Generator",
        generate,
        inputs=[Tensor(name="max_tokens", dtype=np.int32, shape=(1,))],
        outputs=[Tensor(name="token", dtype=np.bytes_, shape=(1,))],
        config=ModelConfig(decoupled=True, max_batch_size=4, sequence_batcher=SequenceBatcher(iterative=True)),
    )
    with server:
        model = server.model("Generator")
        lines: dict[int, str] = {}

        def ask(n: int) -> None:
            started = time.perf_counter()
            words = []
            first = None
            for part in model.stream({"max_tokens": np.array([[n]], np.int32)}):
                first = first if first is not None else time.perf_counter() - started
                words.append(part["token"][0, 0].decode())
            lines[n] = f"{n:2d} tokens (first after {1000 * first:5.1f} ms): {' '.join(words)}"

        threads = [threading.Thread(target=ask, args=(n,)) for n in (12, 3, 7, 1, 9, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for n in (12, 3, 7, 1, 9, 2):
            print(lines[n])
        stats = model.statistics()
        print(f"{stats['execution_count']} iterations for {sum((12, 3, 7, 1, 9, 2))} tokens")


if __name__ == "__main__":
    main()
