"""An OpenAI-compatible chat endpoint for a plain Python generator, called with the `openai` client.

A toy "model" (no weights to download) answers by echoing the user's words back, one chunk per
word, honouring `max_tokens`. It is bound with `embedtriton.openai.bind_chat` as an ordinary
Triton model (decoupled: one response per chunk; 8 instances stream 8 requests at once), and
`serve_http(..., openai=True)` answers OpenAI's routes for it. A toy embedding function is
bound beside it; Triton's dynamic batcher gathers the texts of concurrent clients.

    pip install openai
    python examples/openai_chat.py
"""

from __future__ import annotations

import numpy as np
import openai

from embedtriton import Server
from embedtriton.openai import bind_chat, bind_embedding


def parrot(messages: list[dict], max_tokens: int | None = None, **params: object):
    """Yield the last user message back, a word at a time, at most ``max_tokens`` words."""
    words = ["You", "said:"] + str(messages[-1]["content"]).split()
    for word in words[: max_tokens or len(words)]:
        yield word + " "


def letters(texts: list[str]) -> np.ndarray:
    """A toy embedding: how often each of a, e, i, o, u occurs, per text."""
    return np.array([[t.lower().count(v) for v in "aeiou"] for t in texts], np.float32)


def main() -> None:
    server = Server()
    bind_chat(server, "parrot", parrot)
    bind_embedding(server, "vowels", letters)
    with server:
        port = server.serve_http("127.0.0.1:0", openai=True)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="not-needed")
        print("models:", [m.id for m in client.models.list()])

        answer = client.chat.completions.create(
            model="parrot", messages=[{"role": "user", "content": "hello from the openai client"}]
        )
        print("chat:", answer.choices[0].message.content.strip(), f"({answer.usage.completion_tokens} tokens)")

        stream = client.chat.completions.create(
            model="parrot", messages=[{"role": "user", "content": "one two three four five"}], max_tokens=4, stream=True
        )
        parts = [chunk.choices[0].delta.content for chunk in stream if chunk.choices and chunk.choices[0].delta.content]
        print("stream:", "|".join(parts))

        vectors = client.embeddings.create(model="vowels", input=["banana", "kiwi"])
        print("embeddings:", [d.embedding for d in vectors.data])


if __name__ == "__main__":
    main()
