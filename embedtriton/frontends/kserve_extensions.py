"""The KServe/Triton extensions' requests that the gRPC and HTTP endpoints share, in Triton's
words: the model repository extension (index, load, unload) and trace settings. Each endpoint turns its wire
format into plain Python values, calls these, and encodes what they return."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from ..config.override import parse_override
from ..core import CoreServer
from ..errors import MODEL_CONTROL_REFUSED, InternalError, InvalidArgumentError, TritonError, UnavailableError

log = logging.getLogger("embedtriton")


def repository_index(server: CoreServer, ready_only: bool) -> list[dict[str, str]]:
    """Triton's RepositoryIndex entries (``name``, ``version``, ``state``, ``reason``)."""
    return server.repository_index(ready_only)


def _check_mode(server: CoreServer) -> None:
    """As Triton: load and unload requests only in explicit model control mode. In NONE (the
    default) and POLL alike, Triton's core answers UNAVAILABLE in these words
    (``ModelRepositoryManager::LoadUnloadModel``, model_control_enabled_ is EXPLICIT only),
    before it looks at the name; HTTP sends it as 503. Triton itself runs in explicit mode
    here (so that the application can bind); this is the policy its network clients meet."""
    if server.config.model_control_mode != "explicit":
        raise UnavailableError(MODEL_CONTROL_REFUSED)


def load_work(
    server: CoreServer, name: str, parameters: Mapping[str, Any], missing: type[TritonError] = InternalError
) -> Callable[[], None]:
    """Check a load request (its ``parameters`` as plain values) and return the slow part, the
    load itself, for the endpoint to run off its I/O thread. A name that nothing provides is
    ``missing`` (Triton answers INTERNAL).

    ``file:<path>`` parameters upload model files, which this server cannot use: such a load
    fails as Triton 2.51 fails a file override it cannot use (its core's model repository
    manager: the model is not polled), with INTERNAL "failed to load '<name>', failed to poll
    from model repository" after the control-mode check; the reason goes to the log, as
    Triton's "Poll failed for model directory" does, and what served before serves on."""
    config_text = None
    files = []
    for key, value in parameters.items():  # as Triton reads them, in Triton's words
        if key == "config":
            if not isinstance(value, str):
                raise InvalidArgumentError(
                    f"invalid value type for load parameter '{key}', expected a string (the model config as JSON)."
                )
            config_text = value
        elif key.startswith("file:"):
            files.append(key)
        else:
            raise InvalidArgumentError(f"unrecognized load parameter '{key}'.")
    _check_mode(server)
    if files:
        log.warning(
            "load of '%s' failed: its parameters %s upload model files, which embedtriton does not take (send a "
            "'config' override, or bind the model in the application)",
            name,
            ", ".join(repr(f) for f in files),
        )
        raise InternalError(f"failed to load '{name}', failed to poll from model repository")
    binding = server.binding(name)
    in_repository = binding is None and server._repository_model(name)
    if binding is None and not in_repository:  # Triton: a name its repository does not have
        raise missing(f"failed to load '{name}', failed to poll from model repository")
    config = None
    if config_text is not None:
        if binding is None or in_repository:
            raise InvalidArgumentError(
                f"failed to load '{name}': a config override applies to models bound by the application; "
                "a repository model takes its config from its folder"
            )
        config = parse_override(config_text, name, binding.inputs, binding.outputs, binding.config)
    return lambda: server.load(name, config)


def unload_work(server: CoreServer, name: str, parameters: Mapping[str, Any]) -> Callable[[], None] | None:
    """Check an unload request; the unload to run off the I/O thread, or None when there is
    nothing to unload (Triton answers success)."""
    for key in parameters:
        if key != "unload_dependents":  # Triton's one unload parameter (dependents: none here)
            raise InvalidArgumentError(f"unrecognized unload parameter '{key}'.")
    _check_mode(server)
    if server.binding(name) is None and not server._repository_model(name):
        return None
    return lambda: server.unload(name)


def trace_settings(server: CoreServer, model_name: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """Apply trace settings (each a list of strings, a string, or None for the default) and
    return them all: ``trace_level`` a list, ``trace_rate`` and ``trace_count`` strings."""
    tracer = server.tracer
    if tracer is None:
        raise UnavailableError("tracing is off: start the server with ServerConfig(tracing=Tracing(...))")
    if model_name:
        raise InvalidArgumentError("trace settings are server-wide here; leave the model name out")
    changes: dict[str, Any] = {}
    for key, value in settings.items():
        values = [] if value is None else [value] if isinstance(value, str) else list(value)
        if not all(isinstance(v, str) for v in values):
            raise InvalidArgumentError(f"trace setting '{key}' takes strings, not {value!r}")
        if key == "trace_level":
            if any(v not in ("OFF", "TIMESTAMPS") for v in values):
                raise InvalidArgumentError(f"trace_level {values}: only TIMESTAMPS and OFF are supported")
            changes["level"] = "OFF" if not values or "OFF" in values else "TIMESTAMPS"
        elif key in ("trace_rate", "trace_count"):
            try:
                changes[key[6:]] = int(values[0]) if values else {"trace_rate": 1, "trace_count": -1}[key]
            except ValueError:
                raise InvalidArgumentError(f"{key} must be an integer, not {values[0]!r}") from None
        else:
            raise InvalidArgumentError(
                f"trace setting '{key}' is not supported (spans go to the OpenTelemetry TracerProvider); "
                "supported: trace_level, trace_rate, trace_count"
            )
    current = tracer.update(**changes) if changes else tracer.settings
    return {"trace_level": [current.level], "trace_rate": str(current.rate), "trace_count": str(current.count)}
