"""A decoupled (streaming) model: a toy token generator, served in-process.

Each request asks for a number of tokens; the model yields them one step at a time for
the whole batch, and each caller iterates over its own tokens as they arrive — with
`model.stream(...)` (threads) or `async for ... in model.stream_async(...)` (asyncio).

    python examples/streaming.py
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from embedtriton import DynamicBatcher, ModelConfig, Server, Tensor

WORDS = np.array([b"the", b"quick", b"brown", b"fox", b"jumps", b"over", b"lazy", b"dogs"], dtype=object)


def generate(requests):
    """One step per token; a request that has all its tokens gets no more (None)."""
    wanted = [int(r["max_tokens"][0, 0]) for r in requests]
    for step in range(max(wanted)):
        time.sleep(0.005)  # the "model" works on the whole batch
        yield [
            {"token": np.array([[WORDS[(step + k) % len(WORDS)]]], dtype=object)} if step < n else None
            for k, n in enumerate(wanted)
        ]


def main() -> None:
    server = Server()
    server.bind(
        "Tokens",
        generate,
        inputs=[Tensor(name="max_tokens", dtype=np.int32, shape=(1,))],
        outputs=[Tensor(name="token", dtype=np.bytes_, shape=(1,))],
        config=ModelConfig(decoupled=True, max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=2000)),
    )
    with server:
        model = server.model("Tokens")
        tokens = [part["token"][0, 0].decode() for part in model.stream({"max_tokens": np.array([[5]], np.int32)})]
        print("stream():", " ".join(tokens))

        async def ask(n: int) -> str:
            parts = [
                p["token"][0, 0].decode() async for p in model.stream_async({"max_tokens": np.array([[n]], np.int32)})
            ]
            return f"{n} tokens: {' '.join(parts)}"

        async def many() -> list[str]:
            return await asyncio.gather(*(ask(n) for n in (2, 4, 6)))

        for line in asyncio.run(many()):
            print("stream_async():", line)


if __name__ == "__main__":
    main()
