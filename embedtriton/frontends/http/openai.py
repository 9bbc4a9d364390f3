"""OpenAI's routes on the HTTP endpoint (``HttpOptions(openai=True)``), for the models bound
with :mod:`embedtriton.openai`: ``GET /v1/models`` (and ``/v1/models/{id}``), ``POST
/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings``.

A request is checked field by field (400 naming the field), then becomes Triton requests to the
bound model: ``n`` of them for chat and completion (one per choice), one per input text for
embeddings (so that Triton's dynamic batcher gathers texts from many clients). ``stream: true``
answers Server-Sent Events, one chunk per response, ending with ``data: [DONE]``; a client that
leaves mid-stream cancels its requests (the callable's generator is closed). Errors have
OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, and its status codes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np

from ...core import openai_models as bound
from ...core.request import InferRequest
from ...core.streams import iterate_async
from ...errors import NotFoundError, TritonError
from ..statuses import statuses_of
from .answers import EventStream
from .openai_checks import (
    DONE,
    MAX_INPUTS,
    MAX_INT,
    OpenAIError,
    check_generate,
    check_int,
    check_utf8,
    content_text,
    error_body,
    is_int,
    parse,
    show,
)
from .openai_streams import Closing, Once, close_all, merge


def _triton_status(exc: TritonError) -> int:
    return statuses_of(exc).openai


class OpenAIRoutes:
    """The ``/v1/`` routes of one HTTP endpoint (``api``: its :class:`~.rest.RestApi`)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        key = api.options.openai_api_key
        self._key = hashlib.sha256(f"Bearer {key}".encode()).digest() if key else None

    async def answer(self, method: str, rest: list[str], headers: dict[bytes, bytes], body: bytes) -> tuple[int, Any]:
        """One ``/v1/<rest>`` request's status and answer; every error in OpenAI's shape."""
        try:
            self._authorize(headers)
            if rest == ["models"] or (len(rest) == 2 and rest[0] == "models"):
                if method != "GET":
                    raise OpenAIError(405, f"{method} is not allowed here: use GET", code="method_not_allowed")
                return 200, self._models(rest[1] if len(rest) == 2 else None)
            routes = {"chat/completions": bound.CHAT, "completions": bound.COMPLETION, "embeddings": bound.EMBEDDING}
            kind = routes.get("/".join(rest))
            if kind is None:
                raise OpenAIError(404, f"no such route: /v1/{'/'.join(rest)}", code="unknown_url")
            if method != "POST":
                raise OpenAIError(405, f"{method} is not allowed here: use POST", code="method_not_allowed")
            if self.api.draining:
                raise OpenAIError(503, "the server is stopping", code="server_stopping")
            request = parse(body)
            model = self._model(request, kind)
            if kind == bound.EMBEDDING:
                return 200, await _embeddings(model, request)
            step = bound.is_step(self.api.server, model.name)
            return 200, await _generate(model, request, kind, self.api.options.request_timeout_s, step)
        except OpenAIError as exc:
            return exc.status, error_body(exc.status, str(exc), exc.param, exc.code)
        except TritonError as exc:
            status = _triton_status(exc)
            return status, error_body(status, str(exc))

    def _authorize(self, headers: dict[bytes, bytes]) -> None:
        if self._key is None:
            return
        presented = hashlib.sha256(headers.get(b"authorization", b"")).digest()
        if not hmac.compare_digest(presented, self._key):
            raise OpenAIError(
                401,
                "a valid API key is needed: send the header 'Authorization: Bearer <key>'",
                code="invalid_api_key",
            )

    def _served(self) -> dict[str, str]:
        names = {m.name for m in self.api.server.models()}
        return {n: k for n, k in bound.kinds(self.api.server).items() if n in names}

    def _models(self, name: str | None) -> dict[str, Any]:
        served = self._served()
        if name is not None:
            if name not in served:
                raise OpenAIError(404, f"The model '{name}' does not exist", "model", "model_not_found")
            return _model_entry(name)
        return {"object": "list", "data": [_model_entry(n) for n in sorted(served)]}

    def _model(self, request: dict[str, Any], kind: str) -> Any:
        name = request.get("model")
        if not isinstance(name, str) or not name:
            raise OpenAIError(400, "'model' must be the name of a model (a string): see GET /v1/models", "model")
        found = self._served().get(name)
        if found is None:
            raise OpenAIError(404, f"The model '{name}' does not exist", "model", "model_not_found")
        if found != kind:
            route = {bound.CHAT: "/v1/chat/completions", bound.COMPLETION: "/v1/completions"}.get(
                found, "/v1/embeddings"
            )
            raise OpenAIError(400, f"model '{name}' is a {found} model: send it to {route}", "model")
        try:
            return self.api.server.model(name)
        except NotFoundError:
            raise OpenAIError(404, f"The model '{name}' does not exist", "model", "model_not_found") from None


def _model_entry(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "embedtriton"}


# keys that are the route's, not the callable's
_OWN_KEYS = {bound.CHAT: ("model", "messages", "stream", "stream_options"),
             bound.COMPLETION: ("model", "prompt", "stream", "stream_options")}  # fmt: skip


async def _generate(model: Any, request: dict[str, Any], kind: str, stall_timeout_s: float, step: bool) -> Any:
    """A chat or completion answer: whole, or as an :class:`EventStream` whose client is let go
    after ``stall_timeout_s`` without reading (its requests cancelled). A request per choice
    (``n``); a batch-step model (``step``) is told each one's index."""
    main = check_generate(request, kind)
    params = {k: v for k, v in request.items() if k not in _OWN_KEYS[kind]}
    n = request.get("n") or 1
    stream = bool(request.get("stream"))
    include_usage = stream and bool((request.get("stream_options") or {}).get("include_usage"))
    if kind == bound.CHAT:
        prompt_words = sum(len(content_text(m.get("content")).split()) for m in request["messages"])
    else:
        prompt_words = len(main.split())
    inputs = {
        "messages" if kind == bound.CHAT else "prompt": np.array([[main.encode()]], object),
        "parameters": np.array([[json.dumps(params).encode()]], object),
    }
    loop = asyncio.get_running_loop()
    handles: list[Once] = []  # each closed exactly once, whatever happens (closing cancels)
    streams = []
    try:
        for index in range(n):
            arrived = asyncio.Event()
            choice = InferRequest(dict(inputs), parameters={"index": index} if step else None)
            handle = Once(model.submit(choice, loop, arrived.set, True))
            handles.append(handle)
            streams.append(iterate_async(handle, arrived))  # type: ignore[arg-type]
    except BaseException:
        close_all(handles)
        raise
    answer = _Answer(kind, request["model"], n, prompt_words)
    merged = merge(streams)
    if not stream:
        try:
            async for index, outputs in merged:
                answer.add(index, outputs)
        except TritonError as exc:
            raise _callable_error(exc) from None
        finally:
            try:
                await merged.aclose()
            finally:
                close_all(handles)
        return answer.whole()
    try:  # the first response decides the status: an error before it is a JSON error
        first = await merged.__anext__()
    except StopAsyncIteration:
        first = None
    except BaseException as exc:
        try:
            await merged.aclose()
        finally:
            close_all(handles)
        if isinstance(exc, TritonError):
            raise _callable_error(exc) from None
        raise
    return EventStream(Closing(_events(answer, first, merged, include_usage), handles), stall_timeout_s)


def _callable_error(exc: TritonError) -> OpenAIError:
    status = _triton_status(exc)
    return OpenAIError(status, str(exc), code="model_error" if status == 500 else None)


class _Answer:
    """What the chunks of a chat or completion add up to, and its chunks as OpenAI writes them."""

    def __init__(self, kind: str, model: str, n: int, prompt_words: int) -> None:
        self.kind, self.model = kind, model
        self.id = ("chatcmpl-" if kind == bound.CHAT else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.texts: list[list[str]] = [[] for _ in range(n)]
        self.chunks = [0] * n  # chunks with text, per choice (the estimate of its completion tokens)
        self.finish: list[str | None] = [None] * n
        self.reported_prompt: int | None = None
        self.reported_completion: list[int | None] = [None] * n
        self.prompt_words = prompt_words

    def add(self, index: int, outputs: dict[str, Any]) -> tuple[str, str | None]:
        text = _first(outputs.get("text"))
        text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text or "")
        finish = _first(outputs.get("finish_reason"))
        finish = finish.decode("utf-8", "replace") if isinstance(finish, bytes) else str(finish or "")
        prompt, completion = _first(outputs.get("prompt_tokens")), _first(outputs.get("completion_tokens"))
        if prompt is not None and int(prompt) >= 0:
            self.reported_prompt = int(prompt)
        if completion is not None and int(completion) >= 0:
            self.reported_completion[index] = int(completion)
        if text:
            self.texts[index].append(text)
            self.chunks[index] += 1
        if finish:
            self.finish[index] = finish
        return text, finish or None

    def usage(self) -> dict[str, int]:
        prompt = self.reported_prompt if self.reported_prompt is not None else self.prompt_words
        completion = sum(r if r is not None else c for r, c in zip(self.reported_completion, self.chunks, strict=True))
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _head(self, chunk: bool) -> dict[str, Any]:
        if self.kind == bound.CHAT:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self) -> dict[str, Any]:
        choices = []
        for i, parts in enumerate(self.texts):
            text = "".join(parts)
            finish = self.finish[i] or "stop"
            if self.kind == bound.CHAT:
                message = {"role": "assistant", "content": text}
                choices.append({"index": i, "message": message, "logprobs": None, "finish_reason": finish})
            else:
                choices.append({"index": i, "text": text, "logprobs": None, "finish_reason": finish})
        return {**self._head(False), "choices": choices, "usage": self.usage()}

    def chunk(self, index: int, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if self.kind == bound.CHAT:
            delta: dict[str, Any] = {"role": "assistant", "content": text or ""} if role else {}
            if text and not role:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**self._head(True), "choices": [choice]}


def _first(array: Any) -> Any:
    if array is None:
        return None
    flat = np.asarray(array).reshape(-1)
    if not flat.size:
        return None
    value = flat[0]
    return value.item() if isinstance(value, np.generic) else value


async def _events(
    answer: _Answer,
    first: tuple[int, dict[str, Any]] | None,
    rest: AsyncGenerator[tuple[int, dict[str, Any]], None],
    include_usage: bool,
) -> AsyncGenerator[Any, None]:
    """The Server-Sent Events of a streamed answer: a chunk per response, each choice's last
    chunk with its finish reason, the usage chunk when asked for, then ``[DONE]``."""
    usage: dict[str, Any] = {"usage": None} if include_usage else {}
    try:
        if answer.kind == bound.CHAT:
            for i in range(len(answer.texts)):  # the role first, as OpenAI sends it
                yield {**answer.chunk(i, "", None, role=True), **usage}
        pending = [first] if first is not None else []
        while True:
            if pending:
                index, outputs = pending.pop()
            else:
                try:
                    index, outputs = await rest.__anext__()
                except StopAsyncIteration:
                    break
            text, finish = answer.add(index, outputs)
            if text or finish:
                yield {**answer.chunk(index, text, None), **usage}
        for i in range(len(answer.texts)):
            yield {**answer.chunk(i, None, answer.finish[i] or "stop"), **usage}
        if include_usage:
            yield {**answer._head(True), "choices": [], "usage": answer.usage()}
        yield DONE
    except TritonError as exc:  # after the 200: the error travels as an event, as OpenAI sends it
        status = _triton_status(exc)
        yield error_body(status, str(exc), code="model_error" if status == 500 else None)
    finally:
        await rest.aclose()


# -- embeddings
async def _embeddings(model: Any, request: dict[str, Any]) -> dict[str, Any]:
    texts = request.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts:
        raise OpenAIError(400, "'input' must be a string or a non-empty list of strings", "input")
    if len(texts) > MAX_INPUTS:
        raise OpenAIError(400, f"'input' may hold at most {MAX_INPUTS} texts, not {len(texts)}", "input")
    if not all(isinstance(t, str) for t in texts):
        if all(is_int(t) or (isinstance(t, list) and all(is_int(x) for x in t)) for t in texts):
            raise OpenAIError(400, "token ids are not accepted here: send 'input' as text", "input")
        raise OpenAIError(400, "'input' must be a string or a list of strings", "input")
    for text in texts:
        check_utf8(text, "input")
    encoding = request.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise OpenAIError(
            400, f'\'encoding_format\' must be "float" or "base64", not {show(encoding)}', "encoding_format"
        )
    check_int(request, "dimensions", 1, MAX_INT)
    user = request.get("user")
    if user is not None and not isinstance(user, str):
        raise OpenAIError(400, "'user' must be a string", "user")
    loop = asyncio.get_running_loop()
    futures = []
    batched = model.batched  # (a model bound with batching=False takes [1], not [1, 1])
    for text in texts:
        future = loop.create_future()
        array = np.array([[text.encode()]] if batched else [text.encode()], object)
        model.submit(InferRequest({"text": array}), loop, future)
        futures.append(future)
    try:
        results = await asyncio.gather(*futures)
    except TritonError as exc:
        raise _callable_error(exc) from None
    dimensions = request.get("dimensions")
    data = []
    for i, outputs in enumerate(results):
        vector = np.asarray(outputs["embedding"], dtype=np.float32).reshape(-1)
        if dimensions is not None:
            if dimensions > vector.size:
                raise OpenAIError(
                    400, f"'dimensions' {dimensions} is more than the model's {vector.size}", "dimensions"
                )
            vector = vector[:dimensions]
        value: Any = (
            base64.b64encode(vector.astype("<f4").tobytes()).decode() if encoding == "base64" else vector.tolist()
        )
        data.append({"object": "embedding", "index": i, "embedding": value})
    words = sum(len(t.split()) for t in texts)
    return {
        "object": "list",
        "data": data,
        "model": request["model"],
        "usage": {"prompt_tokens": words, "total_tokens": words},
    }
