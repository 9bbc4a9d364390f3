"""Python callables as OpenAI-style chat, completion and embedding models.

Each ``bind_*`` binds an ordinary Triton model on the server (reachable in process, over gRPC
and HTTP KServe-v2 and in ensembles like any other); ``server.serve_http(address, openai=True)``
then also answers OpenAI's routes for them (``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/v1/models``; see ``docs/openai.md``).

The models' tensors:

- chat (``bind_chat``): input ``messages`` (BYTES ``[1]``: the messages as JSON), optional input
  ``parameters`` (BYTES ``[1]``: a JSON object of keyword arguments for the callable); outputs,
  one response per chunk: ``text`` (BYTES ``[1]``), ``finish_reason`` (BYTES ``[1]``, empty
  until the callable says), ``prompt_tokens`` and ``completion_tokens`` (INT64 ``[1]``, -1 when
  the callable did not report them). The model is decoupled; by default each of its 8 instances
  runs one request's generator at a time (``max_batch_size=1``), so 8 requests stream at once
  and later ones wait in Triton's queue.
- completion (``bind_completion``): the same with input ``prompt`` (BYTES ``[1]``, UTF-8 text).
- the batch-step form (``bind_chat(server, name, step=fn)``, continuous batching): the same
  tensors, ``parameters`` required (``{}`` for none), and the choice index as the request
  parameter ``index`` (0 if left out); an iterative sequence model (see
  :mod:`embedtriton.openai_step`).
- embedding (``bind_embedding``): input ``text`` (BYTES ``[1]``), output ``embedding`` (FP32
  ``[-1]``); a batching model: Triton's dynamic batcher gathers requests from many clients into
  one call of the callable.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .backend.runners import sync_iterator
from .config import DynamicBatcher, InstanceGroup, ModelConfig, SequenceBatcher, Tensor
from .core import Model, openai_models
from .core.openai_models import CHAT, COMPLETION, EMBEDDING
from .errors import InvalidArgumentError
from .openai_step import Chunk, LeaveFunc, Sequence, StepFunc, step_function
from .server import Server

__all__ = ["Chunk", "Sequence", "bind_chat", "bind_completion", "bind_embedding", "kinds"]


ChatFunc = Callable[..., str | Iterable[str | Chunk] | AsyncIterator[str | Chunk]]
EmbedFunc = Callable[[list[str]], ArrayLike]


def kinds(server: Server) -> dict[str, str]:
    """The OpenAI models bound on ``server``: name -> ``"chat"``, ``"completion"`` or ``"embedding"``."""
    return openai_models.kinds(server)


TEXT_OUTPUTS = [
    Tensor(name="text", dtype=np.bytes_, shape=(1,)),
    Tensor(name="finish_reason", dtype=np.bytes_, shape=(1,)),
    Tensor(name="prompt_tokens", dtype=np.int64, shape=(1,)),
    Tensor(name="completion_tokens", dtype=np.int64, shape=(1,)),
]


INSTANCES = 8  # a chat/completion model's default instances: requests streamed at once


def _generator_config(name: str, config: ModelConfig | None) -> ModelConfig:
    """The config of a chat or completion model: decoupled; by default one request per call and
    INSTANCES instances (each a thread running one request's generator)."""
    if config is None:
        return ModelConfig(max_batch_size=1, decoupled=True, instance_group=[InstanceGroup(count=INSTANCES)])
    if not isinstance(config, ModelConfig):
        raise InvalidArgumentError(f"model '{name}': config must be a ModelConfig, not {type(config).__name__}")
    if config.sequence_batcher is not None:
        raise InvalidArgumentError(
            f"model '{name}': an OpenAI chat/completion model is not a sequence model: leave sequence_batcher out"
        )
    if not config.batching:
        raise InvalidArgumentError(
            f"model '{name}': an OpenAI chat/completion model keeps the batch dimension: leave batching=True "
            "(max_batch_size=1 runs one request per call)"
        )
    return dataclasses.replace(config, decoupled=True)


def _text(array: Any, what: str) -> str:
    value = np.asarray(array).reshape(-1)
    if value.size != 1:
        raise ValueError(f"input '{what}' must hold one element, not {value.size}")
    item = value[0]
    return item.decode("utf-8") if isinstance(item, bytes) else str(item)


def _parameters(request: Any) -> dict[str, Any]:
    if "parameters" not in request:
        return {}
    params = json.loads(_text(request["parameters"], "parameters") or "{}")
    if not isinstance(params, dict):
        raise ValueError("input 'parameters' must be a JSON object (the callable's keyword arguments)")
    return params


def _first_argument(request: Any, kind: str, main_input: str) -> Any:
    """What the request's main input gives the callable: the chat's messages (a list), or the
    completion's prompt (a str)."""
    raw = _text(request[main_input], main_input)
    if kind != CHAT:
        return raw
    messages = json.loads(raw)
    if not isinstance(messages, list):
        raise ValueError("input 'messages' must be a JSON list of message objects")
    return messages


def _positive_int(name: str, what: str, value: Any, also: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"model '{name}': {what} must be a positive int{also}, not {value!r}")


def _chunks(result: Any, name: str) -> Generator[Any, None, None]:
    """What the callable returned as an iterator of chunks (str or Chunk), closed when it is."""
    if isinstance(result, (str, Chunk)):
        yield result
        return
    if hasattr(result, "__anext__"):
        yield from sync_iterator(result)
        return
    if not hasattr(result, "__iter__") or isinstance(result, (bytes, dict)):
        raise TypeError(
            f"model '{name}': the callable must return a str or yield str chunks (or Chunk objects), "
            f"not {type(result).__name__}"
        )
    iterator = iter(result)
    try:
        yield from iterator
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def _step(chunk: Any, name: str) -> dict[str, np.ndarray]:
    if isinstance(chunk, str):
        text, prompt, completion, finish = chunk, None, None, None
    elif isinstance(chunk, Chunk):
        text, prompt, completion, finish = chunk.text, chunk.prompt_tokens, chunk.completion_tokens, chunk.finish_reason
    else:
        raise TypeError(f"model '{name}': each chunk must be a str or a Chunk, not {type(chunk).__name__}")
    return {
        "text": np.array([[str(text).encode("utf-8")]], dtype=object),
        "finish_reason": np.array([[(finish or "").encode("utf-8")]], dtype=object),
        "prompt_tokens": np.array([[-1 if prompt is None else int(prompt)]], dtype=np.int64),
        "completion_tokens": np.array([[-1 if completion is None else int(completion)]], dtype=np.int64),
    }


def _bind_generator(
    server: Server, name: str, fn: ChatFunc, config: ModelConfig | None, kind: str, main_input: str
) -> Model:
    if not callable(fn):
        raise InvalidArgumentError(f"model '{name}': fn must be callable, not {type(fn).__name__}")
    config = _generator_config(name, config)

    def one(request: Any) -> Generator[dict[str, np.ndarray], None, None]:
        """One request's responses."""
        first = _first_argument(request, kind, main_input)
        chunks = _chunks(fn(first, **_parameters(request)), name)
        try:
            for chunk in chunks:
                yield _step(chunk, name)
        finally:
            chunks.close()

    def generate(requests: list[Any]) -> Iterator[list[dict[str, np.ndarray] | None]]:
        """A batch's responses, a step of each request's generator at a time (with
        max_batch_size > 1 the batch's streams all end when the last one does)."""
        streams = [one(r) for r in requests]
        live = set(range(len(streams)))
        try:
            while live:
                step: list[dict[str, np.ndarray] | None] = [None] * len(streams)
                for i in sorted(live):
                    try:
                        step[i] = next(streams[i])
                    except StopIteration:
                        live.discard(i)
                if any(out is not None for out in step):
                    yield step
        finally:
            for stream in streams:
                stream.close()

    generate.__name__ = getattr(fn, "__name__", "generate")
    inputs = [
        Tensor(name=main_input, dtype=np.bytes_, shape=(1,)),
        Tensor(name="parameters", dtype=np.bytes_, shape=(1,), optional=True),
    ]
    model = server.bind(name, generate, inputs, TEXT_OUTPUTS, config)
    openai_models.register(server, name, kind)
    return model


# A batch-step model's max_sequence_idle_microseconds (unless its config has a sequence batcher):
# an iteration counts against it, and a sequence's only request comes back at every iteration, so
# the limit bounds how long one iteration may take (a long prompt's prefill on a loaded CPU can
# take seconds), not how long a client may stay away. Triton's default, 1 s, ended sequences.
STEP_IDLE_US = 3_600_000_000


def _step_config(name: str, config: ModelConfig | None, max_sequences: int) -> ModelConfig:
    """A batch-step model's config: an iterative sequence model with max_sequences slots on one
    instance (unless the config names its instances: then max_sequences per instance), whose
    iterations may take up to an hour (STEP_IDLE_US)."""
    _positive_int(name, "max_sequences", max_sequences)
    if config is None:
        config = ModelConfig()
    if not isinstance(config, ModelConfig):
        raise InvalidArgumentError(f"model '{name}': config must be a ModelConfig, not {type(config).__name__}")
    if not config.batching:
        raise InvalidArgumentError(f"model '{name}': a batch-step model batches its sequences: leave batching=True")
    batcher = config.sequence_batcher
    if batcher is None:
        batcher = SequenceBatcher(iterative=True, max_sequence_idle_microseconds=STEP_IDLE_US)
    else:
        batcher = dataclasses.replace(batcher, iterative=True)
    return dataclasses.replace(
        config,
        max_batch_size=max_sequences,
        decoupled=True,
        sequence_batcher=batcher,
        instance_group=config.instance_group or [InstanceGroup(count=1)],
    )


def _bind_step(
    server: Server,
    name: str,
    step: StepFunc,
    config: ModelConfig | None,
    kind: str,
    main_input: str,
    max_sequences: int,
    max_step_tokens: int | None,
    on_leave: LeaveFunc | None,
) -> Model:
    if not callable(step):
        raise InvalidArgumentError(f"model '{name}': step must be callable, not {type(step).__name__}")
    if max_step_tokens is not None:
        _positive_int(name, "max_step_tokens", max_step_tokens, also=" or None")
    if on_leave is not None and not callable(on_leave):
        raise InvalidArgumentError(f"model '{name}': on_leave must be callable, not {type(on_leave).__name__}")
    config = _step_config(name, config, max_sequences)

    def new_sequence(request: Any) -> Sequence:
        first = _first_argument(request, kind, main_input)
        params = _parameters(request)
        index = (request.parameters or {}).get("index", 0)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"the request parameter 'index' (the choice index) must be an int >= 0, not {index!r}")
        if kind == CHAT:
            return Sequence(first, None, params, index=index)
        return Sequence(None, first, params, index=index)

    # (Both inputs required: with an optional input, Triton 2.51's iterative sequence batcher let
    # no new sequence join the running ones until they had all ended.)
    inputs = [
        Tensor(name=main_input, dtype=np.bytes_, shape=(1,)),
        Tensor(name="parameters", dtype=np.bytes_, shape=(1,)),
    ]
    func = step_function(name, step, new_sequence, max_step_tokens, on_leave)
    model = server.bind(name, func, inputs, TEXT_OUTPUTS, config)
    openai_models.register(server, name, kind, step=True)
    return model


def _bind_either(
    server: Server,
    name: str,
    fn: ChatFunc | None,
    config: ModelConfig | None,
    kind: str,
    main_input: str,
    step: StepFunc | None,
    max_sequences: int,
    max_step_tokens: int | None,
    on_leave: LeaveFunc | None,
) -> Model:
    if (fn is None) == (step is None):
        raise InvalidArgumentError(
            f"model '{name}': give either fn (a function of one request) or step= (a function of every "
            "running sequence, called once per iteration), not both or neither"
        )
    if step is not None:
        return _bind_step(server, name, step, config, kind, main_input, max_sequences, max_step_tokens, on_leave)
    return _bind_generator(server, name, fn, config, kind, main_input)  # type: ignore[arg-type]


def bind_chat(
    server: Server,
    name: str,
    fn: ChatFunc | None = None,
    config: ModelConfig | None = None,
    *,
    step: StepFunc | None = None,
    max_sequences: int = 32,
    max_step_tokens: int | None = None,
    on_leave: LeaveFunc | None = None,
) -> Model:
    """Bind ``fn(messages, **params)`` as chat model ``name``: ``messages`` is the list of
    OpenAI message dicts (``{"role": ..., "content": ...}``), ``params`` the request's other
    fields (``max_tokens``, ``temperature``, ``top_p``, ``stop``, ``seed``, ``n``, ... as the
    client gave them). ``fn`` returns a ``str``, or yields ``str`` chunks (or :class:`Chunk`
    objects to report token counts), as a plain or an async generator.

    ``config`` (a :class:`ModelConfig`) defaults to 8 requests streamed at once, each on an
    instance of its own (``max_batch_size=1, decoupled=True, instance_group=[InstanceGroup(count=8)]``);
    a config given is made decoupled. With ``max_batch_size > 1`` a call gets a batch of requests
    and steps their generators in turn; their streams then end together. Returns the bound
    :class:`Model`.

    **The batch-step form** (continuous batching), ``bind_chat(server, name, step=fn)``:
    ``fn(seqs)`` is called once per iteration with every running :class:`Sequence` and returns
    one ``str`` (or :class:`Chunk`) per sequence, in order: its next piece, ``""`` for none this
    iteration, ``Chunk(finish_reason=...)`` to end it; ``async def`` too. One batched forward pass
    per iteration serves every client; a sequence that ends leaves at once and a waiting one joins
    at the next iteration. ``max_sequences`` run at once (the rest wait in order, in Triton's
    queue, with its priorities); ``max_step_tokens`` bounds an iteration's tokens, a new
    sequence counting its prompt's words, so that a long prefill waits instead of stalling every
    stream; ``on_leave(seq)`` is called once when a sequence leaves, finished or not (its client
    left, the call was cancelled), to free what the model holds for it. The server enforces
    ``max_tokens`` / ``max_completion_tokens`` (``"length"``), ``stop`` strings (``"stop"``; no
    part of one is ever sent), ``n`` (a sequence per choice) and counts completion tokens (a
    non-empty piece is a token unless a Chunk reports the count).
    """
    return _bind_either(server, name, fn, config, CHAT, "messages", step, max_sequences, max_step_tokens, on_leave)


def bind_completion(
    server: Server,
    name: str,
    fn: ChatFunc | None = None,
    config: ModelConfig | None = None,
    *,
    step: StepFunc | None = None,
    max_sequences: int = 32,
    max_step_tokens: int | None = None,
    on_leave: LeaveFunc | None = None,
) -> Model:
    """Bind ``fn(prompt, **params)`` as completion model ``name`` (``/v1/completions``):
    ``prompt`` is the request's text; otherwise as :func:`bind_chat`, the batch-step form
    (``step=fn``, each :class:`Sequence` with ``.prompt``) included."""
    return _bind_either(server, name, fn, config, COMPLETION, "prompt", step, max_sequences, max_step_tokens, on_leave)


def bind_embedding(server: Server, name: str, fn: EmbedFunc, config: ModelConfig | None = None) -> Model:
    """Bind ``fn(texts)`` as embedding model ``name``: ``texts`` is a list of strings, the
    result an array-like ``[len(texts), dim]`` of floats. Each text is one Triton request: the
    dynamic batcher gathers requests from many clients into one call.

    ``config`` defaults to ``ModelConfig(max_batch_size=64, batcher=DynamicBatcher())``; with
    ``batching=False`` each call gets one text. Returns the bound :class:`Model`.
    """
    if not callable(fn):
        raise InvalidArgumentError(f"model '{name}': fn must be callable, not {type(fn).__name__}")
    if config is None:
        config = ModelConfig(max_batch_size=64, batcher=DynamicBatcher())
    if not isinstance(config, ModelConfig):
        raise InvalidArgumentError(f"model '{name}': config must be a ModelConfig, not {type(config).__name__}")
    if config.decoupled or config.sequence_batcher is not None:
        raise InvalidArgumentError(f"model '{name}': an embedding model is neither decoupled nor a sequence model")
    batched = config.batching

    def embed(requests: list[Any]) -> list[dict[str, np.ndarray]]:
        texts: list[str] = []
        counts: list[int] = []
        for r in requests:
            flat = np.asarray(r["text"]).reshape(-1)
            texts.extend(v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in flat)
            counts.append(len(flat))
        vectors = np.asarray(fn(texts), dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(texts):
            raise ValueError(
                f"the embedding function must return an array [len(texts), dim] = [{len(texts)}, dim], "
                f"not one of shape {list(vectors.shape)}"
            )
        out, at = [], 0
        for n in counts:
            part = vectors[at : at + n]
            out.append({"embedding": part if batched else part.reshape(-1)})
            at += n
        return out

    embed.__name__ = getattr(fn, "__name__", "embed")
    model = server.bind(
        name,
        embed,
        [Tensor(name="text", dtype=np.bytes_, shape=(1,))],
        [Tensor(name="embedding", dtype=np.float32, shape=(-1,))],
        config,
    )
    openai_models.register(server, name, EMBEDDING)
    return model
