"""Triton's HTTP extensions besides inference: the model repository (index, load, unload),
system and CUDA shared memory, logging and trace settings, with the paths, bodies and answers
of Triton's ``http_server.cc``. The logic is the gRPC endpoint's (:mod:`..kserve_extensions`,
:mod:`..shared_memory`); here only JSON in and out."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
from collections.abc import Callable
from typing import Any

from ...core import CoreServer
from ...errors import SERVER_STOPPING, InvalidArgumentError, NotFoundError, UnavailableError
from .. import kserve_extensions
from ..shared_memory import CUDA, CUDA_IPC_HANDLE_BYTES, SYSTEM, SharedMemory, refuse_cuda_without_gpu
from .answers import Refused


def json_object(body: bytes, what: str = "request") -> dict[str, Any]:
    """A request body that must be a JSON object (an empty body is ``{}``)."""
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"malformed JSON {what} body: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"the {what} body must be a JSON object")
    return value


async def repository(server: CoreServer, draining: bool, method: str, rest: list[str], body: bytes) -> Any:
    """``POST /v2/repository/index`` and ``/v2/repository/models/{m}/load|unload``."""
    request = json_object(body)
    if method != "POST":
        raise Refused(405, "Method Not Allowed")
    if rest == ["index"]:
        return kserve_extensions.repository_index(server, bool(request.get("ready")))
    if len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload"):
        if draining:
            raise UnavailableError(SERVER_STOPPING)
        params = request.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidArgumentError("'parameters' must be a JSON object")
        name = rest[1]
        work: Callable[[], None] | None
        if rest[2] == "load":  # a name nothing provides is a client's mistake: 404 (Triton: 500)
            work = kserve_extensions.load_work(server, name, params, missing=NotFoundError)
        else:
            work = kserve_extensions.unload_work(server, name, params)
        if work is not None:
            await asyncio.get_running_loop().run_in_executor(None, work)
        return None
    raise Refused(404, f"no such repository endpoint: {'/'.join(rest)}")


def shared_memory(
    shm: SharedMemory, enabled: bool, draining: bool, kind: str, method: str, rest: list[str], body: bytes
) -> Any:
    """``/v2/{system,cuda}sharedmemory[/region/{name}]/status|register|unregister``."""
    name = ""
    if len(rest) == 3 and rest[0] == "region":
        name, rest = rest[1], rest[2:]
    if len(rest) != 1 or rest[0] not in ("status", "register", "unregister"):
        raise Refused(404, f"no such shared-memory endpoint: {'/'.join(rest)}")
    action = rest[0]
    if (action == "status") != (method == "GET") or method not in ("GET", "POST"):
        raise Refused(405, "Method Not Allowed")
    memory = CUDA if kind == "cudasharedmemory" else SYSTEM
    if action == "status":
        return [r.status() for r in shm.status(name, memory)]
    if action == "unregister":
        shm.unregister(name, memory)
        return None
    if memory == CUDA:
        _register_cuda(shm, enabled, draining, name, body)
        return None
    if not enabled:
        raise InvalidArgumentError("system shared memory is turned off on this endpoint (HttpOptions.shared_memory)")
    if draining:
        raise UnavailableError(SERVER_STOPPING)
    if not name:
        raise Refused(404, "register needs a region name: /v2/systemsharedmemory/region/{name}/register")
    request = json_object(body, "register")
    key = request.get("key")
    if not isinstance(key, str):
        raise InvalidArgumentError("Shared memory register request has no 'key' string (the shm_open name)")
    shm.register(name, key, _integer(request, "offset", 0), _integer(request, "byte_size", None))
    return None


def _integer(request: dict[str, Any], field: str, default: int | None) -> int:
    value = request.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgumentError(f"Shared memory register request needs an integer '{field}', not {value!r}")
    return value


def _register_cuda(shm: SharedMemory, enabled: bool, draining: bool, name: str, body: bytes) -> None:
    """``POST /v2/cudasharedmemory/region/{name}/register`` with ``{"raw_handle": {"b64": ...},
    "device_id": N, "byte_size": N}``: read and checked in the order and words of Triton's
    HandleCudaSharedMemory (its JSON errors are 400s here: the client's mistake)."""
    refuse_cuda_without_gpu(name)  # as Triton built without GPU support answers, first
    if not enabled:
        raise InvalidArgumentError("CUDA shared memory is turned off on this endpoint (HttpOptions.shared_memory)")
    if draining:
        raise UnavailableError(SERVER_STOPPING)
    if not name:
        raise InvalidArgumentError("'region name' is necessary to register cuda shared memory region")
    request = json_object(body, "register")
    if "raw_handle" not in request:
        raise InvalidArgumentError("Shared memory register request has no 'raw_handle' field")
    raw_handle = request["raw_handle"]
    if not isinstance(raw_handle, dict) or "b64" not in raw_handle:
        raise InvalidArgumentError("attempt to access non-existing object member 'b64'")
    b64 = raw_handle["b64"]
    if not isinstance(b64, str):
        raise InvalidArgumentError("attempt to access JSON non-string as string")
    numbers = {}
    for field in ("byte_size", "device_id"):
        if field not in request:
            raise InvalidArgumentError(f"attempt to access non-existing object member '{field}'")
        value = request[field]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
            raise InvalidArgumentError("attempt to access JSON non-unsigned-integer as unsigned-integer")
        numbers[field] = value
    try:  # leniently, as Triton's libb64 decoder: other characters are skipped, padding is optional
        digits = re.sub(r"[^A-Za-z0-9+/]", "", b64)
        handle = base64.b64decode(digits + "=" * (-len(digits) % 4))
    except (binascii.Error, ValueError):
        handle = b""
    if len(handle) != CUDA_IPC_HANDLE_BYTES:
        raise InvalidArgumentError("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    shm.register_cuda(name, handle, numbers["device_id"], numbers["byte_size"])


def logging_settings(server: CoreServer, method: str, body: bytes) -> Any:
    """``GET`` / ``POST /v2/logging``: Triton's log settings, after the changes posted."""
    if method == "GET":
        return server.log_settings()
    changes = json_object(body, "logging")  # checked by the core (log_file is fixed)
    return server.log_settings(**{k: v for k, v in changes.items() if v is not None})


def trace_settings(server: CoreServer, model_name: str, method: str, body: bytes) -> Any:
    """``GET`` / ``POST /v2[/models/{m}]/trace/setting``."""
    changes = json_object(body, "trace setting") if method == "POST" else {}
    return kserve_extensions.trace_settings(server, model_name, changes)
