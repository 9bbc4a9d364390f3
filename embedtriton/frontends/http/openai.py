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
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from ... import openai as bound
from ...core.request import InferRequest
from ...core.streams import iterate_async
from ...errors import InvalidArgumentError, NotFoundError, TritonError, UnavailableError
from .connection import EventStream

MAX_N = 16  # choices per request
MAX_INPUTS = 2048  # texts per embeddings request (as OpenAI's)
MAX_STOP = 4  # stop sequences (as OpenAI's)
MAX_INT = 2**31 - 1
DONE = b"[DONE]"

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "invalid_request_error",
          404: "invalid_request_error", 405: "invalid_request_error", 408: "invalid_request_error",
          411: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
          431: "invalid_request_error", 503: "service_unavailable"}  # fmt: skip


class OpenAIError(Exception):
    """A refusal in OpenAI's shape: status, message, and the field it is about."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _triton_status(exc: TritonError) -> int:
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, UnavailableError):
        return 503
    if isinstance(exc, InvalidArgumentError):
        return 400
    return 500


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
            request = _parse(body)
            model = self._model(request, kind)
            if kind == bound.EMBEDDING:
                return 200, await _embeddings(model, request)
            return 200, await _generate(model, request, kind)
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


def _parse(body: bytes) -> dict[str, Any]:
    try:
        request = json.loads(body)
    except RecursionError:
        raise OpenAIError(400, "the request body is JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise OpenAIError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(request, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    return request


# -- field checks (400 naming the field)
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _int(request: dict[str, Any], name: str, low: int, high: int) -> None:
    v = request.get(name)
    if v is not None and (not _is_int(v) or not low <= v <= high):
        raise OpenAIError(400, f"'{name}' must be an integer from {low} to {high}, not {_show(v)}", name)


def _number(request: dict[str, Any], name: str, low: float, high: float) -> None:
    v = request.get(name)
    if v is not None and (not _is_number(v) or not low <= v <= high):
        raise OpenAIError(400, f"'{name}' must be a number from {low:g} to {high:g}, not {_show(v)}", name)


def _show(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _utf8(text: str, name: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise OpenAIError(400, f"'{name}' is not valid Unicode text: {exc.reason}", name) from None


def _content_text(content: Any) -> str:
    """A message's content as text (for token estimates): a string, or its text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _check_generate(request: dict[str, Any], kind: str) -> str:
    """The checked request's main input as text (messages as JSON, or the prompt)."""
    if kind == bound.CHAT:
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise OpenAIError(400, "'messages' must be a non-empty list of message objects", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise OpenAIError(400, f"'messages[{i}]' must be an object with 'role' and 'content'", "messages")
            if not isinstance(m.get("role"), str) or not m["role"]:
                raise OpenAIError(400, f"'messages[{i}].role' must be a string such as \"user\"", "messages")
            content = m.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise OpenAIError(400, f"'messages[{i}].content' must be a string or a list of parts", "messages")
        main = json.dumps(messages)
    else:
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise OpenAIError(400, "'prompt' must be a string (one prompt per request)", "prompt")
        _utf8(prompt, "prompt")
        main = prompt
    for flag in ("stream", "echo", "logprobs") if kind == bound.COMPLETION else ("stream", "logprobs"):
        v = request.get(flag)
        if v is not None and not isinstance(v, bool) and not (flag == "logprobs" and _is_int(v)):
            raise OpenAIError(400, f"'{flag}' must be true or false, not {_show(v)}", flag)
    options = request.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise OpenAIError(
                400, "'stream_options' must be an object such as {\"include_usage\": true}", "stream_options"
            )
        if not request.get("stream"):
            raise OpenAIError(400, "'stream_options' is only allowed with 'stream': true", "stream_options")
        if not isinstance(options.get("include_usage", False), bool):
            raise OpenAIError(400, "'stream_options.include_usage' must be true or false", "stream_options")
    _int(request, "n", 1, MAX_N)
    _int(request, "max_tokens", 1, MAX_INT)
    _int(request, "max_completion_tokens", 1, MAX_INT)
    _int(request, "seed", -(2**63), 2**63 - 1)
    _number(request, "temperature", 0, 2)
    _number(request, "top_p", 0, 1)
    _number(request, "presence_penalty", -2, 2)
    _number(request, "frequency_penalty", -2, 2)
    stop = request.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or len(stop) > MAX_STOP or not all(isinstance(s, str) for s in stop):
            raise OpenAIError(400, f"'stop' must be a string or a list of at most {MAX_STOP} strings", "stop")
    user = request.get("user")
    if user is not None and not isinstance(user, str):
        raise OpenAIError(400, "'user' must be a string", "user")
    return main


# keys that are the route's, not the callable's
_OWN_KEYS = {bound.CHAT: ("model", "messages", "stream", "stream_options"),
             bound.COMPLETION: ("model", "prompt", "stream", "stream_options")}  # fmt: skip


async def _generate(model: Any, request: dict[str, Any], kind: str) -> Any:
    main = _check_generate(request, kind)
    params = {k: v for k, v in request.items() if k not in _OWN_KEYS[kind]}
    n = request.get("n") or 1
    stream = bool(request.get("stream"))
    include_usage = stream and bool((request.get("stream_options") or {}).get("include_usage"))
    if kind == bound.CHAT:
        prompt_words = sum(len(_content_text(m.get("content")).split()) for m in request["messages"])
    else:
        prompt_words = len(main.split())
    inputs = {
        "messages" if kind == bound.CHAT else "prompt": np.array([[main.encode()]], object),
        "parameters": np.array([[json.dumps(params).encode()]], object),
    }
    loop = asyncio.get_running_loop()
    streams = []
    try:
        for _ in range(n):
            arrived = asyncio.Event()
            handle = model.submit(InferRequest(dict(inputs)), loop, arrived.set, True)
            streams.append(iterate_async(handle, arrived))
    except BaseException:
        for s in streams:
            await s.aclose()
        raise
    answer = _Answer(kind, request["model"], n, prompt_words)
    merged = _merge(streams)
    if not stream:
        try:
            async for index, outputs in merged:
                answer.add(index, outputs)
        except TritonError as exc:
            raise _callable_error(exc) from None
        finally:
            await merged.aclose()
        return answer.whole()
    try:  # the first response decides the status: an error before it is a JSON error
        first = await merged.__anext__()
    except StopAsyncIteration:
        first = None
    except TritonError as exc:
        await merged.aclose()
        raise _callable_error(exc) from None
    except BaseException:
        await merged.aclose()
        raise
    return EventStream(_events(answer, first, merged, include_usage))


def _callable_error(exc: TritonError) -> OpenAIError:
    status = _triton_status(exc)
    return OpenAIError(status, str(exc), code="model_error" if status == 500 else None)


async def _merge(streams: list[AsyncIterator[dict[str, Any]]]) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """The responses of several streams as they come, with the index of each one's stream."""
    if len(streams) == 1:
        try:
            async for outputs in streams[0]:
                yield 0, outputs
        finally:
            await streams[0].aclose()  # type: ignore[attr-defined]
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    done = object()

    async def pump(index: int, source: AsyncIterator[dict[str, Any]]) -> None:
        try:
            async for outputs in source:
                await queue.put((index, outputs))
            await queue.put((index, done))
        except TritonError as exc:
            await queue.put((index, exc))
        finally:
            await source.aclose()  # type: ignore[attr-defined]

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            index, item = await queue.get()
            if item is done:
                left -= 1
            elif isinstance(item, TritonError):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


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
    rest: AsyncIterator[tuple[int, dict[str, Any]]],
    include_usage: bool,
) -> AsyncIterator[Any]:
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
        await rest.aclose()  # type: ignore[attr-defined]


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
        if all(_is_int(t) or (isinstance(t, list) and all(_is_int(x) for x in t)) for t in texts):
            raise OpenAIError(400, "token ids are not accepted here: send 'input' as text", "input")
        raise OpenAIError(400, "'input' must be a string or a list of strings", "input")
    for text in texts:
        _utf8(text, "input")
    encoding = request.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise OpenAIError(
            400, f'\'encoding_format\' must be "float" or "base64", not {_show(encoding)}', "encoding_format"
        )
    _int(request, "dimensions", 1, MAX_INT)
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
