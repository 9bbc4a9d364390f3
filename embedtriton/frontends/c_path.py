"""When the C path may take a KServe inference call: the one place that says so.

The C path (native/_native/kserve.c with kserve_pb.c for gRPC and kserve_json.c for HTTP/REST)
decodes a plain ``ModelInfer`` or ``/infer`` request, runs it and answers it without Python. It
must answer exactly as the Python path would, so it declines unless everything about the call is
known to be handled the same way:

- every field of :class:`HttpOptions`, :class:`GrpcOptions` (and its :class:`GrpcLimits`) is
  classified below as ``TAKEN`` (C does what the Python path does with it, or it does not touch
  inference) or with the condition under which C declines every call; a field missing here
  declines too, and ``tests/unit/test_c_path.py`` fails until it is classified;
- the server's and endpoint's state: a tracer (the Python path makes the spans), a stopping
  server, a draining endpoint;
- the model (:func:`admit`): only bindings whose every attribute that changes how a request is
  answered is classified in :data:`MODEL`;
- the request: the KServe parameters each C decoder takes are listed in :data:`REQUEST_PARAMETERS`,
  :data:`INPUT_PARAMETERS` and :data:`OUTPUT_PARAMETERS`; it declines any other (the Python path
  then reads them), and each field of :class:`~embedtriton.core.InferRequest` is classified in
  :data:`INFER_REQUEST` by where it comes from. The tests hold the C decoders to these tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from ..core import CoreServer
from ..errors import InvalidArgumentError
from ..tensors import BY_NAME
from .kserve import EMPTY_FINAL_RESPONSE, model_version

TAKEN = None
"""A field the C path handles as the Python path does (or that does not touch inference)."""

Declines = Callable[[Any], bool]  # the field's value -> whether C must decline every call


def _set(value: Any) -> bool:
    return value is not None


def _restricts_inference(restrictions: Any) -> bool:
    return restrictions.get("inference") is not None


def _not_native(transport: str) -> bool:
    return transport != "native"


# HttpOptions' fields. The transport's own limits are applied before any route, in C.
HTTP_OPTIONS: dict[str, Declines | None] = {
    "address": TAKEN,
    "max_body_bytes": TAKEN,
    "max_header_bytes": TAKEN,
    "max_connections": TAKEN,
    "idle_timeout_s": TAKEN,
    "request_timeout_s": TAKEN,
    "max_buffered_bytes": TAKEN,
    "tls_cert": TAKEN,  # (TLS is the transport's: the C path answers through it)
    "tls_key": TAKEN,
    "tls_client_ca": TAKEN,
    "shared_memory": TAKEN,  # (its routes are the Python path's; an /infer naming a region is declined)
    "openai": TAKEN,  # (routes under /v1/ only)
    "openai_api_key": TAKEN,
    "restricted_api": TAKEN,  # (read as `restrictions`)
    "restrictions": _restricts_inference,  # C does not check the header of a restricted /infer
    "header_forward_pattern": TAKEN,  # (read as `forward`)
    "forward": _set,  # forwarded headers become request parameters: the Python path's
}

# GrpcOptions' fields, and GrpcLimits' (limits.<name>).
GRPC_OPTIONS: dict[str, Declines | None] = {
    "address": TAKEN,
    "max_message_bytes": TAKEN,
    "tls_cert": TAKEN,
    "tls_key": TAKEN,
    "tls_client_ca": TAKEN,
    "transport": _not_native,  # the C path answers the native transport's calls only
    "limits": TAKEN,  # (its fields below)
    "limits.max_connections": TAKEN,
    "limits.idle_timeout_s": TAKEN,
    "limits.handshake_timeout_s": TAKEN,
    "limits.max_header_list_bytes": TAKEN,
    "limits.max_buffered_bytes": TAKEN,
    "shared_memory": TAKEN,
    "infer_response_compression_level": TAKEN,  # chosen on the call before C answers it
    "restricted_protocol": TAKEN,  # (read as `restrictions`)
    "restrictions": TAKEN,  # a restricted call is refused before its message reaches C
    "header_forward_pattern": TAKEN,  # (read as `forward`)
    "forward": _set,
    "max_buffered_bytes": TAKEN,
}

# What a model's binding may be for C to take its requests, by attribute (getattr's default for
# bindings without it): the C path submits to Triton and answers from Triton's response alone.
MODEL: dict[str, tuple[Any, Declines | None]] = {
    "decoupled": (False, bool),  # responses as they come: the Python path's streams
    "required_inputs": (None, _set),  # optional inputs: the Python path checks which came
    "batch_rule": (None, _set),  # its batcher calls Python: handed over without the GIL
    "step_models": (None, _set),  # an ensemble: errors name its steps
}

# The KServe parameters each C decoder takes; a request with any other is declined.
REQUEST_PARAMETERS: dict[str, frozenset[str]] = {
    "grpc": frozenset({EMPTY_FINAL_RESPONSE}),  # (it matters to streams only: dropped)
    "http": frozenset({"binary_data_output"}),
}
INPUT_PARAMETERS: dict[str, frozenset[str]] = {"grpc": frozenset(), "http": frozenset({"binary_data_size"})}
OUTPUT_PARAMETERS: dict[str, frozenset[str]] = {"grpc": frozenset(), "http": frozenset({"binary_data"})}

# InferRequest's fields: TAKEN (C fills it from the message as the Python path does), or the
# KServe request parameter that sets it (declined by the decoders: not in REQUEST_PARAMETERS),
# or why C never sets it.
INFER_REQUEST: dict[str, str | None] = {
    "inputs": TAKEN,  # raw contents (gRPC), data or binary_data_size (HTTP); shared memory declined
    "outputs": TAKEN,  # names (and binary_data on HTTP); shared-memory outputs declined
    "request_id": TAKEN,  # the message's id
    "priority": "priority",
    "timeout_us": "timeout",
    "sequence": "sequence_id",  # (with sequence_start, sequence_end)
    "parameters": "any other parameter",
    "trace_parent": "a tracer (the server's, declined)",
    "trace_sink": "a tracer (the server's, declined)",
    "output_device": "host memory only (network answers)",
}
SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")


def options_declining(options: Any, table: Mapping[str, Declines | None]) -> list[str]:
    """The fields of an endpoint's options (dataclasses, nested ones as ``outer.inner``) for which
    C must decline every call: those whose condition holds, and those not classified in ``table``."""
    found = []
    for name, value in _fields(options):
        if name not in table:
            found.append(f"{name} (not classified in embedtriton/frontends/c_path.py)")
        elif (declines := table[name]) is not None and declines(value):
            found.append(name)
    return found


def _fields(options: Any, prefix: str = "") -> list[tuple[str, Any]]:
    found = []
    for f in dataclasses.fields(options):
        value = getattr(options, f.name, None)
        found.append((prefix + f.name, value))
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            found.extend(_fields(value, f"{prefix}{f.name}."))
    return found


def server_declines(server: CoreServer, draining: bool) -> bool:
    """What of the server's and the endpoint's state sends every call to the Python path."""
    return draining or server.tracer is not None or server._stopping


def admit(server: CoreServer, table: dict[Any, Any], name: str, version: str, json: bool = False) -> None:
    """A frontend's C-path entry for a model (``table[(name, version)] = (binding, number)``,
    number None where the C path must decline): a bound model (not one of Triton's own) whose
    attributes in :data:`MODEL` all allow it, and a well-formed version. ``json`` (the REST path,
    whose answers it writes): outputs of a datatype numpy has, not BYTES."""
    if len(table) >= 1024:  # (names and versions come from clients)
        table.clear()
    binding = server._bound.get(name)
    try:
        number: int | None = model_version(version)
    except InvalidArgumentError:
        number = None
    if binding is None or model_declines(binding) or (json and not _json_outputs(binding)):
        number = None
    table[(name, version)] = (binding, number)


def model_declines(binding: Any) -> list[str]:
    """The attributes of a binding (see :data:`MODEL`) for which C declines its requests."""
    return [
        name for name, (default, declines) in MODEL.items() if declines and declines(getattr(binding, name, default))
    ]


def _json_outputs(binding: Any) -> bool:
    by_value = {d.value: d.name for d in BY_NAME.values()}
    datatypes = [by_value.get(spec[1], "BYTES") for spec in getattr(binding, "output_specs", None) or [(None, -1)]]
    return all(BY_NAME[dt].numpy is not None and dt != "BYTES" for dt in datatypes)
