"""Options and their validation: GrpcOptions / GrpcLimits, ServerConfig, and the per-request
options of ``Model.infer`` (RequestOptions -> InferRequest)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from embedtriton import (
    GrpcLimits,
    GrpcOptions,
    HttpOptions,
    InvalidArgumentError,
    RequestOptions,
    ServerConfig,
    UnsupportedError,
)
from embedtriton.core.request import (
    SEQUENCE_END,
    SEQUENCE_START,
    TAKES,
    InferRequest,
    sequence_of,
    shown,
    timeout_of,
    with_deadline,
)
from embedtriton.frontends.grpc.options import normalize_address
from embedtriton.server import _endpoint_options
from embedtriton.triton import devices

INPUTS = {"x": object()}

# -- GrpcLimits ----------------------------------------------------------------------------------


def test_grpc_limits_defaults_and_transport_options():
    assert GrpcLimits().transport_options() == {
        "max_connections": 1024,
        "idle_timeout": 300.0,
        "handshake_timeout": 10.0,
        "max_header_list_bytes": 16 * 1024,
        "max_buffered_bytes": 64 * 1024 * 1024,
    }
    options = GrpcLimits(max_connections=3, idle_timeout_s=2, handshake_timeout_s=0.5).transport_options()
    assert options["max_connections"] == 3
    assert options["idle_timeout"] == 2.0 and type(options["idle_timeout"]) is float  # ints become seconds as float
    assert options["handshake_timeout"] == 0.5


@pytest.mark.parametrize("name", ["max_connections", "max_header_list_bytes", "max_buffered_bytes"])
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "10", None])
def test_grpc_limits_counts_must_be_positive_integers(name, value):
    with pytest.raises(InvalidArgumentError) as info:
        GrpcLimits(**{name: value})
    assert str(info.value) == f"GrpcLimits.{name} must be a positive integer, not {value!r}"


@pytest.mark.parametrize("name", ["idle_timeout_s", "handshake_timeout_s"])
@pytest.mark.parametrize("value", [0, -0.5, False, "5", math.nan, None])
def test_grpc_limits_timeouts_must_be_positive_seconds(name, value):
    with pytest.raises(InvalidArgumentError) as info:
        GrpcLimits(**{name: value})
    assert str(info.value) == f"GrpcLimits.{name} must be a positive number of seconds, not {value!r}"


# -- GrpcOptions ---------------------------------------------------------------------------------


def test_grpc_options_defaults():
    options = GrpcOptions()
    assert options.address == "127.0.0.1:8001"  # loopback unless told otherwise
    assert options.max_message_bytes == 64 * 1024 * 1024
    assert options.transport == "native" and options.shared_memory is True
    assert options.infer_response_compression_level == "none"  # as Triton's default
    assert options.limits == GrpcLimits()
    assert options.tls is None


def test_grpc_options_tls():
    assert GrpcOptions(tls_cert="c.pem", tls_key="k.pem").tls == ("c.pem", "k.pem", None)
    assert GrpcOptions(tls_cert="c.pem", tls_key="k.pem", tls_client_ca="ca.pem").tls == ("c.pem", "k.pem", "ca.pem")
    with pytest.raises(InvalidArgumentError, match=r"^TLS needs both tls_cert and tls_key \(PEM files\)$"):
        GrpcOptions(tls_cert="c.pem")
    with pytest.raises(InvalidArgumentError, match="TLS needs both"):
        GrpcOptions(tls_key="k.pem")
    with pytest.raises(InvalidArgumentError, match=r"^tls_client_ca \(client-certificate verification\) needs"):
        GrpcOptions(tls_client_ca="ca.pem")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_message_bytes": 0}, "max_message_bytes must be > 0, not 0"),
        ({"max_message_bytes": -5}, "max_message_bytes must be > 0, not -5"),
        ({"max_message_bytes": 1.5}, "max_message_bytes must be > 0, not 1.5"),
        pytest.param(
            {"max_message_bytes": True},
            "max_message_bytes must be > 0, not True",
            id="bool-max_message_bytes",
        ),
        ({"transport": "h3"}, "transport must be 'native' or 'grpcio', not 'h3'"),
        ({"limits": {"max_connections": 1}}, "limits must be a GrpcLimits, not dict"),
        (
            {"infer_response_compression_level": "gzip"},
            "infer_response_compression_level must be 'none', 'low', 'medium' or 'high', not 'gzip'",
        ),
        (
            {"infer_response_compression_level": ["low"]},
            "infer_response_compression_level must be 'none', 'low', 'medium' or 'high', not ['low']",
        ),
    ],
)
def test_grpc_options_refusals(kwargs, message):
    with pytest.raises(InvalidArgumentError) as info:
        GrpcOptions(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("level", ["none", "low", "medium", "high"])
def test_grpc_options_compression_levels(level):
    assert GrpcOptions(infer_response_compression_level=level).infer_response_compression_level == level


def test_grpc_options_are_frozen():
    with pytest.raises(AttributeError):
        GrpcOptions().transport = "grpcio"  # type: ignore[misc]


# -- max_buffered_bytes: request bytes held across connections -----------------------------------


def test_max_buffered_bytes_is_a_budget_across_connections_apart_from_the_per_connection_bound():
    assert HttpOptions().max_buffered_bytes == GrpcOptions().max_buffered_bytes == 512 * 1024 * 1024
    assert GrpcOptions().limits.max_buffered_bytes == 64 * 1024 * 1024  # (GrpcLimits': one connection's)
    # serve_http(..., max_buffered_bytes=...) and serve_grpc(...) take it as a setting
    http = _endpoint_options("HTTP", HttpOptions(), None, {"max_buffered_bytes": 1 << 20})
    grpc = _endpoint_options("gRPC", GrpcOptions(), None, {"max_buffered_bytes": 1 << 20}, skip_none=True)
    assert http.max_buffered_bytes == grpc.max_buffered_bytes == 1 << 20
    assert grpc.limits.max_buffered_bytes == 64 * 1024 * 1024


@pytest.mark.parametrize("options", [HttpOptions, GrpcOptions])
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "10", None])
def test_max_buffered_bytes_must_be_a_positive_integer(options, value):
    with pytest.raises(InvalidArgumentError) as info:
        options(max_buffered_bytes=value)
    assert str(info.value) == f"{options.__name__}.max_buffered_bytes must be a positive integer, not {value!r}"


# -- ServerConfig --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entries, expected",
    [
        ([], []),
        (["local,size=1048576"], [("local", {"size": "1048576"})]),
        (["local"], [("local", {})]),
        (["local, size = 5 "], [("local", {"size": "5"})]),
        (
            ["local,size=1", "local,eviction=lru", "redis,host=h"],
            [("local", {"size": "1", "eviction": "lru"}), ("redis", {"host": "h"})],
        ),
        (["local,size=1", "local,size=2"], [("local", {"size": "2"})]),  # the last one wins
        (["redis,password=a=b"], [("redis", {"password": "a=b"})]),  # only the first '=' splits
    ],
)
def test_cache_settings(entries, expected):
    settings = ServerConfig(cache_config=entries).cache_settings()
    assert [(name, json.loads(text)) for name, text in settings] == expected
    assert all(isinstance(text, str) for _, text in settings)  # Triton takes each cache's config as JSON text


@pytest.mark.parametrize(
    "entry",
    [
        "local,size",
        ",size=1",
        "",
        "local,1048576",
        pytest.param("   ,size=1", id="blank-name"),  # was a cache named ''
        pytest.param("local,size=1,junk", id="pair-without-="),  # was junk=''
    ],
)
def test_cache_settings_refusals(entry):
    message = f"cache_config entry {entry!r}: expected 'NAME,KEY=VALUE[,KEY=VALUE]', e.g. 'local,size=1048576'"
    with pytest.raises(InvalidArgumentError) as info:
        ServerConfig(cache_config=[entry]).cache_settings()
    assert str(info.value) == message
    with pytest.raises(InvalidArgumentError, match="cache_config entry"):
        ServerConfig(cache_config=[entry]).validate()


@pytest.mark.parametrize(
    "name, value, least",
    [
        ("exit_timeout_secs", -1, 0),
        ("exit_timeout_secs", True, 0),
        ("exit_timeout_secs", 1.5, 0),
        ("exit_timeout_secs", "30", 0),
        ("metrics_interval_ms", 0, 1),
        ("metrics_interval_ms", None, 1),
    ],
)
def test_server_config_validate_refusals(name, value, least):
    with pytest.raises(InvalidArgumentError) as info:
        ServerConfig(**{name: value}).validate()
    assert str(info.value) == f"ServerConfig.{name} must be an integer >= {least}, not {value!r}"


def test_server_config_validate_accepts_the_bounds():
    assert ServerConfig(exit_timeout_secs=0, metrics_interval_ms=1).validate() is None
    assert ServerConfig().validate() is None


def test_server_config_defaults():
    config = ServerConfig()
    assert config.exit_timeout_secs == 30 and config.metrics_interval_ms == 200
    assert config.cache_config == [] and config.model_repository == [] and config.tracing is None
    assert ServerConfig().cache_config is not config.cache_config  # no shared mutable default


# -- per-request options -------------------------------------------------------------------------


def test_request_option_names():
    assert set(RequestOptions.__annotations__) == {
        "parameters",
        "priority",
        "timeout_us",
        "request_id",
        "outputs",
        "correlation_id",
        "sequence_start",
        "sequence_end",
        "output_device",
    }


def test_no_options_make_a_plain_request():
    request = InferRequest.from_options(INPUTS, {})
    assert request.inputs is INPUTS
    assert (request.outputs, request.request_id, request.priority, request.timeout_us) == (None,) * 4
    assert (request.parameters, request.sequence, request.trace_parent) == (None,) * 3


def test_every_option_lands_in_its_field():
    request = InferRequest.from_options(
        INPUTS,
        {
            "outputs": ["y"],
            "request_id": "r-1",
            "priority": 2,
            "timeout_us": 500,
            "parameters": {"p": 1},
            "output_device": "cpu",
        },
    )
    assert request.outputs == ["y"] and request.request_id == "r-1"
    assert request.priority == 2 and request.timeout_us == 500
    assert request.parameters == {"p": 1} and request.sequence is None


def test_unknown_options_are_refused_naming_them_and_the_options():
    with pytest.raises(InvalidArgumentError) as info:
        InferRequest.from_options(INPUTS, {"timeout": 5, "priority": 1, "corelation_id": 3})
    message = str(info.value)
    assert message.startswith("unknown request option(s) ['corelation_id', 'timeout']; the options are [")
    for name in RequestOptions.__annotations__:
        assert repr(name) in message


@pytest.mark.parametrize(
    "start, end, flags",
    [(False, False, 0), (True, False, SEQUENCE_START), (False, True, SEQUENCE_END), (True, True, 3)],
)
@pytest.mark.parametrize("correlation_id", [7, "user-1"])
def test_sequence_flags(correlation_id, start, end, flags):
    assert (SEQUENCE_START, SEQUENCE_END) == (1, 2)  # TRITONSERVER_RequestFlag
    options = {"correlation_id": correlation_id, "sequence_start": start, "sequence_end": end}
    assert InferRequest.from_options(INPUTS, options).sequence == (correlation_id, flags)
    assert sequence_of(correlation_id, start, end) == (correlation_id, flags)


@pytest.mark.parametrize("flag", ["sequence_start", "sequence_end"])
def test_sequence_flags_need_a_correlation_id(flag):
    with pytest.raises(InvalidArgumentError, match=r"^sequence_start/sequence_end need a correlation_id$"):
        InferRequest.from_options(INPUTS, {flag: True})
    assert InferRequest.from_options(INPUTS, {flag: False}).sequence is None


@pytest.mark.parametrize(
    "device", ["tpu", "cuda", "GPU", None, "gpu:", "gpu:x", "gpu:-1", "cpu:0", "gpu:\u00b2", 0, np.array(["cpu"] * 2)]
)
def test_output_device_other_than_cpu_or_gpu_is_refused(device):
    with pytest.raises(InvalidArgumentError) as info:
        InferRequest.from_options(INPUTS, {"output_device": device})
    assert str(info.value) == f"output_device must be 'cpu', 'gpu' or 'gpu:N', not {shown(device)}"


def test_output_device_gpu_without_a_gpu(monkeypatch):
    monkeypatch.setattr(devices, "cuda_devices", lambda: (0, "no CUDA runtime library (test)"))
    with pytest.raises(UnsupportedError, match=r"output_device='gpu' needs a CUDA GPU, .*\(no CUDA runtime library"):
        InferRequest.from_options(INPUTS, {"output_device": "gpu"})


def test_output_device_names_the_gpu(monkeypatch):
    monkeypatch.setattr(devices, "cuda_devices", lambda: (2, ""))
    assert InferRequest.from_options(INPUTS, {"output_device": "cpu"}).output_device == -1
    assert InferRequest.from_options(INPUTS, {}).output_device == -1
    assert InferRequest.from_options(INPUTS, {"output_device": "gpu"}).output_device == 0
    assert InferRequest.from_options(INPUTS, {"output_device": "gpu:1"}).output_device == 1
    with pytest.raises(UnsupportedError, match=r"^output_device='gpu:2' asks for GPU 2, but this process sees 2 GPU"):
        InferRequest.from_options(INPUTS, {"output_device": "gpu:2"})


@pytest.mark.parametrize(
    "options, message",
    [
        ({"parameters": 5}, f"parameters must be {TAKES['parameters']}, not 5"),
        ({"parameters": [("k", 1)]}, f"parameters must be {TAKES['parameters']}, not [('k', 1)]"),
        ({"request_id": 1}, "request_id must be a str, not 1"),
        ({"correlation_id": 1, "sequence_start": "false"}, "sequence_start must be True or False, not 'false'"),
        ({"correlation_id": 1, "sequence_end": 0}, "sequence_end must be True or False, not 0"),
        ({"sequence_end": None}, "sequence_end must be True or False, not None"),
    ],
)
def test_options_read_in_python_are_refused_there(options, message):
    with pytest.raises(InvalidArgumentError) as info:
        InferRequest.from_options(INPUTS, options)
    assert str(info.value) == message


def test_options_the_native_submit_checks_pass_through():
    options = {"priority": "1", "timeout_us": "1", "outputs": "y", "correlation_id": 1.5}
    request = InferRequest.from_options(INPUTS, options)  # (refused by submit, in the same words)
    assert (request.priority, request.timeout_us, request.outputs, request.sequence) == ("1", "1", "y", (1.5, 0))


def test_timeout_of():
    assert [timeout_of(v) for v in (None, 0, 5, 2**64 - 1, np.int64(7), np.uint64(2**64 - 1))] == [
        0, 0, 5, 2**64 - 1, 7, 2**64 - 1
    ]  # fmt: skip
    for value in ("1", -1, 2**64, 1.5, math.nan, True, np.float32(1), np.array([1, 2]), [1]):
        with pytest.raises(InvalidArgumentError) as info:
            timeout_of(value)
        assert str(info.value) == f"timeout_us must be {TAKES['timeout_us']}, not {shown(value)}"


def test_with_deadline_keeps_the_parameters_and_fits_in_int64():
    assert with_deadline(None, 5, "d") == {"d": 5}
    assert with_deadline({"k": 1}, 2**70, "d") == {"k": 1, "d": 2**63 - 1}  # (timeout_us up to 2**64-1)
    with pytest.raises(InvalidArgumentError, match=r"^parameters must be a mapping .*, not \[\('k', 1\)\]$"):
        with_deadline([("k", 1)], 5, "d")


def test_shown_cuts_long_values_and_survives_a_failing_repr():
    class Unprintable:
        def __repr__(self):
            raise RuntimeError("no")

    assert shown("x" * 78) == repr("x" * 78) and len(shown("x" * 79)) == 80
    assert shown("x" * 200) == "'" + "x" * 76 + "..."
    assert shown(10**5000) == "<int object>" and shown(Unprintable()) == "<Unprintable object>"


@pytest.mark.parametrize(
    "given, expected",
    [
        (8001, "127.0.0.1:8001"),
        (":8001", "127.0.0.1:8001"),
        ("8001", "127.0.0.1:8001"),
        ("127.0.0.1:0", "127.0.0.1:0"),
        ("0.0.0.0:8001", "0.0.0.0:8001"),  # every interface only when asked for
        ("[::1]:8001", "[::1]:8001"),
        ("localhost:08001", "localhost:8001"),
    ],
)
def test_addresses_default_to_loopback(given, expected):
    assert GrpcOptions(address=given).address == expected
    assert normalize_address(given, "metrics") == expected


@pytest.mark.parametrize("bad", ["host:port", "127.0.0.1:70000", "[]:1", True, 1.5, None, "127.0.0.1:"])
def test_bad_addresses_are_refused(bad):
    with pytest.raises(InvalidArgumentError, match=r"gRPC address must (look like host:port|be 'host:port')"):
        GrpcOptions(address=bad)


def test_functions_of_arrays_need_batch():
    from embedtriton import batch
    from embedtriton.backend.batch import signature_problem

    def add(a, b):
        return {"y": a + b}

    def kwargs_only(**inputs):
        return inputs

    assert "decorate it with @embedtriton.batch" in signature_problem(add)
    assert "infer_func(a, b)" in signature_problem(add)
    assert signature_problem(kwargs_only) is not None
    assert signature_problem(batch(add)) is None  # the wrapper takes the list
    assert signature_problem(lambda requests: requests) is None
    assert signature_problem(lambda requests, extra=1: requests) is None
    assert signature_problem(lambda *args: args) is None

    class Counted:
        def __call__(self, requests):
            return requests

    assert signature_problem(Counted()) is None  # a callable object: its __call__ is checked
