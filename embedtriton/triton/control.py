"""Triton's control plane on a running server handle: creating and stopping servers, loading
and unloading models, readiness, metadata, statistics, the model index and metrics. Every
function returns Python values or raises a :class:`~embedtriton.errors.TritonError`."""

from __future__ import annotations

import ctypes
import json
import time
from collections.abc import Callable
from ctypes import byref, c_char_p, c_size_t, c_void_p
from typing import Any

from ..errors import TritonError
from . import capi


def new_server(options: int) -> int:
    handle = capi.out_handle()
    capi.api().ServerNew(byref(handle), options)
    return handle.value  # type: ignore[return-value]  # a successful ServerNew set it (not NULL)


def stop_server(handle: int, exit_timeout_secs: int) -> None:
    """Stop Triton (it waits up to ``exit_timeout_secs`` for models still unloading)."""
    api = capi.api()
    api.ServerSetExitTimeout(handle, max(0, exit_timeout_secs))
    api.ServerStop(handle)


def delete_server(handle: int) -> None:
    capi.api().ServerDelete(handle)


def _flag(function: str, handle: int, *args: Any) -> bool:
    value = capi.flag()
    getattr(capi.api(), function)(handle, *args, byref(value))
    return value.value


def is_live(handle: int) -> bool:
    return _flag("ServerIsLive", handle)


def is_ready(handle: int) -> bool:
    return _flag("ServerIsReady", handle)


def model_is_ready(handle: int, name: str, version: int) -> bool:
    return _flag("ServerModelIsReady", handle, name.encode(), version)


def _message(function: str, handle: int, *args: Any) -> Any:
    api = capi.api()
    message = capi.out_handle()
    getattr(api, function)(handle, *args, byref(message))
    return api.message_json(message)


def server_metadata(handle: int) -> dict[str, Any]:
    return _message("ServerMetadata", handle)


def model_metadata(handle: int, name: str, version: int) -> dict[str, Any]:
    return _message("ServerModelMetadata", handle, name.encode(), version)


def model_config(handle: int, name: str, version: int) -> dict[str, Any]:
    return _message("ServerModelConfig", handle, name.encode(), version, 1)


def model_statistics(handle: int, name: str, version: int) -> dict[str, Any]:
    return _message("ServerModelStatistics", handle, name.encode(), version)


def model_index(handle: int) -> list[dict[str, Any]]:
    return _message("ServerModelIndex", handle, 0)


def metrics(handle: int) -> str:
    """Triton's metrics in Prometheus text format."""
    api = capi.api()
    found = capi.out_handle()
    api.ServerMetrics(handle, byref(found))
    try:
        base, size = c_char_p(), c_size_t()
        api.MetricsFormatted(found, capi.METRIC_PROMETHEUS, byref(base), byref(size))
        return ctypes.string_at(base, size.value).decode()
    finally:
        api.MetricsDelete(found)


def load_model(handle: int, name: str, config: dict[str, Any] | None) -> None:
    """Load (or reload) a model in explicit mode with its config given as JSON (None: the
    model folder's own ``config.pbtxt``)."""
    api = capi.api()
    if config is None:
        api.ServerLoadModelWithParameters(handle, name.encode(), None, 0)
        return
    raw = ctypes.create_string_buffer(json.dumps(config).encode())  # alive for the whole call
    param = api.ParameterNew(b"config", capi.PARAMETER_STRING, ctypes.cast(raw, c_void_p))
    try:
        api.ServerLoadModelWithParameters(handle, name.encode(), (c_void_p * 1)(param), 1)
    finally:
        api.ParameterDelete(param)


def unload_model(handle: int, name: str, deadline: float, delete_released: Callable[[], Any]) -> None:
    """Unload a model and wait until it is gone (or ``deadline``, a ``time.monotonic()``).

    Unload returns before it is done; Triton's stop() waits in 1 s steps for models still
    unloading, so wait here. Released requests hold the model until they are deleted:
    ``delete_released`` deletes them meanwhile."""
    unload_models(handle, [name], deadline, delete_released)


def unload_models(handle: int, names: list[str], deadline: float, delete_released: Callable[[], Any]) -> None:
    """Unload several models at once, as Triton's own stop does, and wait until all are gone (or
    ``deadline``): a python-backend model's stub takes about a second to exit, so a repository of
    11 of them took 16 s to stop one by one. The wait polls Triton's index every 0.5 ms at first,
    then less often (up to every 20 ms), so that it leaves the CPU to what is unloading."""
    api = capi.api()
    for name in names:
        api.ServerUnloadModel(handle, name.encode())
    waiting, pause = set(names), 0.0005
    while waiting and time.monotonic() < deadline:
        delete_released()
        try:
            index = model_index(handle)
        except TritonError:
            break
        busy = {e["name"] for e in index if e.get("state") in ("READY", "LOADING", "UNLOADING")}
        waiting &= busy
        if waiting:
            time.sleep(pause)
            pause = min(pause * 1.5, 0.02)
