"""The checks of OpenAI's routes (:mod:`.openai`): request fields one by one (400 naming the
field), and errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
import math
from typing import Any

from ...core.openai_models import CHAT, COMPLETION

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


def parse(body: bytes) -> dict[str, Any]:
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
def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def check_int(request: dict[str, Any], name: str, low: int, high: int) -> None:
    v = request.get(name)
    if v is not None and (not is_int(v) or not low <= v <= high):
        raise OpenAIError(400, f"'{name}' must be an integer from {low} to {high}, not {show(v)}", name)


def check_number(request: dict[str, Any], name: str, low: float, high: float) -> None:
    v = request.get(name)
    if v is not None and (not is_number(v) or not low <= v <= high):
        raise OpenAIError(400, f"'{name}' must be a number from {low:g} to {high:g}, not {show(v)}", name)


def show(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def check_utf8(text: str, name: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise OpenAIError(400, f"'{name}' is not valid Unicode text: {exc.reason}", name) from None


def content_text(content: Any) -> str:
    """A message's content as text (for token estimates): a string, or its text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def check_generate(request: dict[str, Any], kind: str) -> str:
    """The checked request's main input as text (messages as JSON, or the prompt)."""
    if kind == CHAT:
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
        check_utf8(prompt, "prompt")
        main = prompt
    for flag in ("stream", "echo", "logprobs") if kind == COMPLETION else ("stream", "logprobs"):
        v = request.get(flag)
        if v is not None and not isinstance(v, bool) and not (flag == "logprobs" and is_int(v)):
            raise OpenAIError(400, f"'{flag}' must be true or false, not {show(v)}", flag)
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
    check_int(request, "n", 1, MAX_N)
    check_int(request, "max_tokens", 1, MAX_INT)
    check_int(request, "max_completion_tokens", 1, MAX_INT)
    check_int(request, "seed", -(2**63), 2**63 - 1)
    check_number(request, "temperature", 0, 2)
    check_number(request, "top_p", 0, 1)
    check_number(request, "presence_penalty", -2, 2)
    check_number(request, "frequency_penalty", -2, 2)
    stop = request.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list) or len(stop) > MAX_STOP or not all(isinstance(s, str) for s in stop):
            raise OpenAIError(400, f"'stop' must be a string or a list of at most {MAX_STOP} strings", "stop")
    user = request.get("user")
    if user is not None and not isinstance(user, str):
        raise OpenAIError(400, "'user' must be a string", "user")
    return main
