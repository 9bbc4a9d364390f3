"""Continuous batching of a small causal transformer behind OpenAI's chat route.

`TinyLM` is a GPT-style decoder (token and position embeddings, pre-norm attention and MLP
blocks, an output head) with random weights from a fixed seed, so nothing is downloaded;
its tokenizer is byte-level (a token per UTF-8 byte, built here). Each sequence keeps its own
KV cache in `Sequence.state`. One call of `step` is one iteration for every running sequence:
the new ones prefill their prompts, then one batched decode pass makes the next token of each
(the projections and the MLP are matrix products over the whole batch). Sequences join and
leave between iterations; the server stops each at `max_tokens` or a `stop` string.

`generate` is the same model in the per-request form (one request's generator, decoding a
batch of one), for comparison: `benchmarks/bench_llm.py` measures both.

    python examples/llm_continuous.py
    cd examples && embedtriton serve llm_continuous:bind --http 127.0.0.1:8000 --openai
"""

from __future__ import annotations

import threading
import time

import numpy as np
import openai

from embedtriton import Server
from embedtriton.openai import Chunk, Sequence, bind_chat


class ByteTokenizer:
    """A token per UTF-8 byte (vocabulary 256); generation keeps to printable ASCII."""

    vocab = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, tokens: list[int]) -> str:
        return bytes(tokens).decode("utf-8", "replace")

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        text = "".join(f"<{m.get('role', 'user')}>{m.get('content', '')}\n" for m in messages) + "<assistant>"
        return self.encode(text)


def layer_norm(x: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)


class TinyLM:
    """A decoder-only transformer with random weights (float32, numpy)."""

    def __init__(self, layers: int = 4, dim: int = 256, heads: int = 4, context: int = 1024, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.dim, self.heads, self.context = dim, heads, context
        scale = 1 / np.sqrt(dim)
        self.embed = rng.normal(0, 1, (256, dim)).astype(np.float32)
        self.position = rng.normal(0, 0.1, (context, dim)).astype(np.float32)
        self.head = rng.normal(0, 2 * scale, (dim, 256)).astype(np.float32)
        self.blocks = [
            {
                "qkv": rng.normal(0, scale, (dim, 3 * dim)).astype(np.float32),
                "out": rng.normal(0, scale, (dim, dim)).astype(np.float32),
                "up": rng.normal(0, scale, (dim, 4 * dim)).astype(np.float32),
                "down": rng.normal(0, scale / 2, (4 * dim, dim)).astype(np.float32),
            }
            for _ in range(layers)
        ]
        self.printable = np.full(256, -1e9, np.float32)
        self.printable[32:127] = 0.0  # (generation keeps to printable ASCII)

    def _attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
        """q [t, dim] over k, v [n, dim] (the last t of the n positions are q's), by head."""
        t, n, h = q.shape[0], k.shape[0], self.heads
        qh, kh, vh = (a.reshape(a.shape[0], h, -1).transpose(1, 0, 2) for a in (q, k, v))
        scores = qh @ kh.transpose(0, 2, 1) / np.sqrt(qh.shape[-1])  # [h, t, n]
        if causal:
            scores = scores + np.triu(np.full((t, n), -1e9, np.float32), n - t + 1)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        weights = scores / scores.sum(-1, keepdims=True)
        return (weights @ vh).transpose(1, 0, 2).reshape(t, -1)

    def forward(self, tokens: list[list[int]], caches: list[list[list[np.ndarray]]]) -> np.ndarray:
        """The next-token logits [batch, 256] of each sequence, feeding it ``tokens[i]`` after what
        its cache holds (appended to). The projections and MLPs run once for the whole batch."""
        lengths = [len(t) for t in tokens]
        starts = [cache[0][0].shape[0] if cache[0] else 0 for cache in caches]
        if any(s + n > self.context for s, n in zip(starts, lengths, strict=True)):
            raise ValueError(f"a sequence is longer than the model's context ({self.context} tokens)")
        positions = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths, strict=True)])
        x = self.embed[np.concatenate(tokens)] + self.position[positions]  # [sum(lengths), dim]
        bounds = np.cumsum([0, *lengths])
        for layer, block in enumerate(self.blocks):
            q, k, v = np.split(layer_norm(x) @ block["qkv"], 3, axis=-1)
            mixed = []
            for i, cache in enumerate(caches):
                part = slice(bounds[i], bounds[i + 1])
                if len(cache[layer]) == 0:
                    cache[layer].extend((k[part], v[part]))
                else:
                    cache[layer][0] = np.concatenate([cache[layer][0], k[part]])
                    cache[layer][1] = np.concatenate([cache[layer][1], v[part]])
                mixed.append(self._attend(q[part], cache[layer][0], cache[layer][1], lengths[i] > 1))
            x = x + np.concatenate(mixed) @ block["out"]
            x = x + np.maximum(layer_norm(x) @ block["up"], 0) @ block["down"]
        last = layer_norm(x[bounds[1:] - 1])  # each sequence's last position
        return last @ self.head + self.printable

    def new_cache(self) -> list[list[np.ndarray]]:
        return [[] for _ in self.blocks]

    def sample(self, logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
        if temperature <= 0:
            return int(logits.argmax())
        p = np.exp((logits - logits.max()) / temperature)
        return int(rng.choice(256, p=p / p.sum()))


MODEL = TinyLM()
TOKENIZER = ByteTokenizer()
DEFAULT_MAX_TOKENS = 16  # an answer's length when the client gives no max_tokens


def step(seqs: list[Sequence]) -> list[Chunk]:
    """One iteration for every running sequence: prefill the new ones' prompts and feed the
    others their last token, in one batched forward pass; sample each one's next token (the
    first one reports the prompt's length in tokens, for the usage counts)."""
    for seq in seqs:
        if seq.new:
            seq.state["cache"] = MODEL.new_cache()
            seq.state["feed"] = TOKENIZER.chat_prompt(seq.messages or [])
            seq.state["rng"] = np.random.default_rng(seq.params.get("seed", seq.index))
    prompts = [len(s.state["feed"]) if s.new else None for s in seqs]
    logits = MODEL.forward([s.state["feed"] for s in seqs], [s.state["cache"] for s in seqs])
    pieces = []
    for seq, row, prompt in zip(seqs, logits, prompts, strict=True):
        token = MODEL.sample(row, float(seq.params.get("temperature", 1.0)), seq.state["rng"])
        seq.state["feed"] = [token]
        seq.state["made"] = made = seq.state.get("made", 0) + 1
        # (the server ends it at the client's max_tokens; without one, or at the context's end, here)
        full = seq.state["cache"][0][0].shape[0] + 1 >= MODEL.context
        asked = seq.params.get("max_completion_tokens", seq.params.get("max_tokens"))
        end = "length" if full or (asked is None and made >= DEFAULT_MAX_TOKENS) else None
        pieces.append(Chunk(TOKENIZER.decode([token]), prompt_tokens=prompt, finish_reason=end))
    return pieces


def generate(messages: list[dict], temperature: float = 1.0, seed: int = 0, **params: object):
    """The same model in the per-request form: one request, decoded as a batch of one."""
    cache, feed = MODEL.new_cache(), TOKENIZER.chat_prompt(messages)
    rng, prompt = np.random.default_rng(seed), len(feed)
    asked = params.get("max_completion_tokens", params.get("max_tokens"))
    limit = min(int(asked) if isinstance(asked, int) else DEFAULT_MAX_TOKENS, MODEL.context - len(feed))
    for _ in range(limit):
        token = MODEL.sample(MODEL.forward([feed], [cache])[0], float(temperature), rng)
        feed = [token]
        yield Chunk(TOKENIZER.decode([token]), prompt_tokens=prompt)


def bind(server: Server) -> None:
    """Both forms of the model: ``tiny`` (batch-step) and ``tiny-alone`` (per request), e.g. for
    ``embedtriton serve llm_continuous:bind --http 127.0.0.1:8000 --openai`` run here."""
    bind_chat(server, "tiny", step=step, max_sequences=32)
    bind_chat(server, "tiny-alone", generate)


def main() -> None:
    server = Server()
    bind(server)
    with server:
        port = server.serve_http("127.0.0.1:0", openai=True)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="not-needed")
        hello = [{"role": "user", "content": "hello"}]
        answer = client.chat.completions.create(model="tiny", messages=hello, max_tokens=12, temperature=0)
        print(f"greedy: {answer.choices[0].message.content!r} ({answer.choices[0].finish_reason})")
        again = client.chat.completions.create(model="tiny", messages=hello, max_tokens=12, temperature=0)
        print("same again:", again.choices[0].message.content == answer.choices[0].message.content)

        stream = client.chat.completions.create(model="tiny", messages=hello, max_tokens=8, seed=3, stream=True)
        print("stream:", "|".join(c.choices[0].delta.content or "" for c in stream if c.choices))

        answers: dict[int, str] = {}
        started = time.perf_counter()

        def ask(i: int) -> None:
            talk = [{"role": "user", "content": f"client {i}"}]
            out = client.chat.completions.create(model="tiny", messages=talk, max_tokens=8 + 4 * i, seed=i)
            answers[i] = out.choices[0].message.content

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        tokens = sum(len(a) for a in answers.values())
        stats = server.model("tiny").statistics()
        print(
            f"8 concurrent clients: {tokens} tokens in {time.perf_counter() - started:.2f} s, "
            f"{stats['execution_count']} iterations in all (a token per sequence each)"
        )


if __name__ == "__main__":
    main()
