"""What the clients share: server URLs, argument checks, turning inputs into tritonclient's
requests and results back into arrays, and readiness waits (sync; the asyncio ones are in
:mod:`.aio`). Built on the stock ``tritonclient`` package (http, grpc and their aio forms)."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from .._convert import parse_triton_config
from ..exceptions import PyTritonClientInvalidUrlError, PyTritonClientTimeoutError, PyTritonClientValueError
from ..model_config.triton_model_config import TritonModelConfig
from .auth import create_auth_headers

DEFAULT_PORTS = {"http": 8000, "grpc": 8001}
DEFAULT_INIT_TIMEOUT_S = 300.0  # PyTriton's: waiting for the server and the model at the first call
DEFAULT_INFERENCE_TIMEOUT_S = 60.0  # PyTriton's: one inference (over HTTP: any request of the infer client)
DEFAULT_NETWORK_TIMEOUT_S = 60.0  # PyTriton's cap on the other requests' network timeout


@dataclasses.dataclass(frozen=True)
class TritonUrl:
    """A server URL: ``http://host:port``, ``grpc://host:port``, or ``host[:port]`` (HTTP, as
    in PyTriton); a missing port is the scheme's default (8000 for HTTP, 8001 for gRPC)."""

    scheme: str
    hostname: str
    port: int

    @classmethod
    def from_url(cls, url: str) -> TritonUrl:
        if not isinstance(url, str) or not url.strip():
            raise PyTritonClientInvalidUrlError(f"Invalid url {url!r}: expected e.g. 'grpc://localhost:8001'")
        text = url.strip() if "://" in url else f"http://{url.strip()}"
        try:
            parts = urlsplit(text)
            scheme = parts.scheme.lower()
            port = parts.port
        except ValueError as exc:
            raise PyTritonClientInvalidUrlError(f"Invalid url {url!r}: {exc}") from None
        if scheme not in DEFAULT_PORTS:
            raise PyTritonClientInvalidUrlError(f"Invalid url {url!r}: the scheme must be http or grpc, not {scheme!r}")
        if not parts.hostname:
            raise PyTritonClientInvalidUrlError(f"Invalid url {url!r}: no host")
        return cls(scheme, parts.hostname, port or DEFAULT_PORTS[scheme])

    @property
    def with_scheme(self) -> str:
        return f"{self.scheme}://{self.without_scheme}"

    @property
    def without_scheme(self) -> str:
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{host}:{self.port}"


def check_call(inputs: tuple[Any, ...], named: Mapping[str, Any], parameters: Any, headers: Any) -> None:
    """Inputs given one way (positional or named, not both, not none); parameters and headers
    dicts of str -> str/int/bool."""
    if not inputs and not named:
        raise PyTritonClientValueError("Provide input data")
    if inputs and named:
        raise PyTritonClientValueError("Use either positional either keyword method arguments convention")
    for what in (parameters, headers):
        if what is None:
            continue
        if not isinstance(what, dict):
            raise PyTritonClientValueError("Parameters and headers must be a dictionary")
        for key, value in what.items():
            if not isinstance(key, str):
                raise PyTritonClientValueError("Parameter/header key must be a string")
            if not isinstance(value, (str, int, bool)):
                raise PyTritonClientValueError("Parameter/header value must be a string, integer or boolean")


def named_inputs(config: TritonModelConfig, inputs: tuple[Any, ...], named: Mapping[str, Any]) -> dict[str, Any]:
    """Positional inputs are the model's inputs in their declared order."""
    if not inputs:
        return dict(named)
    declared = config.inputs or []
    if len(inputs) > len(declared):
        raise PyTritonClientValueError(f"{len(inputs)} inputs given; model {config.model_name} takes {len(declared)}")
    return {spec.name: value for spec, value in zip(declared, inputs, strict=False)}


def build_request(lib: Any, config: TritonModelConfig, inputs: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    """tritonclient's InferInput list (from numpy arrays) and the model's outputs, all requested."""
    from tritonclient.utils import np_to_triton_dtype

    wrapped = []
    for name, data in inputs.items():
        if not isinstance(data, np.ndarray):
            raise PyTritonClientValueError(f"Input {name} is not a numpy array. Got {type(data)} instead.")
        if data.dtype.kind == "U":
            raise RuntimeError(
                f"Unicode inputs are not supported. Encode numpy array for {name!r} input "
                "(ex. with np.char.encode(array, 'utf-8'))."
            )
        if data.dtype == object and data.size and not isinstance(data.reshape(-1)[0], bytes):
            raise RuntimeError(
                f"Numpy array for {name!r} input with dtype=object should contain encoded strings "
                f"(e.g. into utf-8). Element type: {type(data.reshape(-1)[0])}"
            )
        tensor = lib.InferInput(name, list(data.shape), np_to_triton_dtype(data.dtype))
        tensor.set_data_from_numpy(data)
        wrapped.append(tensor)
    outputs = [lib.InferRequestedOutput(spec.name) for spec in config.outputs or []]
    return wrapped, outputs


def result_arrays(result: Any) -> dict[str, np.ndarray]:
    """An InferResult (HTTP or gRPC) as output name -> array."""
    response = result.get_response()
    names = (
        [o["name"] for o in response["outputs"]] if isinstance(response, dict) else [o.name for o in response.outputs]
    )
    return {name: result.as_numpy(name) for name in names}


def model_config_of(client: Any, model_name: str, version: str | None) -> TritonModelConfig:
    """The model's configuration, from the server (HTTP or gRPC client, sync)."""
    if client.__class__.__module__.startswith("tritonclient.grpc"):
        raw = client.get_model_config(model_name, version or "", as_json=True)["config"]
    else:
        raw = client.get_model_config(model_name, version or "")
    return parse_triton_config(raw)


def _ask(check: Any) -> bool:
    """A readiness check; an unreachable server (connection refused, DNS...) is not ready."""
    from tritonclient.utils import InferenceServerException

    try:
        return bool(check())
    except (InferenceServerException, OSError):
        return False
    except Exception as exc:  # grpc's RpcError and gevent's errors come as their own types
        if type(exc).__module__.split(".")[0] in ("grpc", "gevent", "geventhttpclient"):
            return False
        raise


def wait_for_server_ready(client: Any, timeout_s: float) -> None:
    """Until the server is live and ready, or PyTritonClientTimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pause = 0.02
    while not _ask(lambda: client.is_server_live() and client.is_server_ready()):
        if time.monotonic() >= deadline:
            raise PyTritonClientTimeoutError("Waiting for server to be ready timed out.")
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 1.0)


def wait_for_model_ready(client: Any, model_name: str, version: str | None, timeout_s: float) -> None:
    """Until the server and the model (``version``, or the latest) are ready, or
    PyTritonClientTimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    wait_for_server_ready(client, timeout_s)
    pause = 0.02
    while not _ask(lambda: client.is_model_ready(model_name, version or "")):
        if time.monotonic() >= deadline:
            raise PyTritonClientTimeoutError(
                f"Waiting for model {model_name}/{version or '<latest>'} to be ready timed out."
            )
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 1.0)


class ClientState:
    """What :func:`set_up` gives every model client (declared for the type checker; no behaviour)."""

    _triton_url: TritonUrl
    _url: str
    _model_name: str
    _model_version: str | None
    _init_timeout_s: float
    _inference_timeout_s: float
    _headers: dict[str, str] | None
    _access_token: str | None
    _lib: Any  # tritonclient.http or tritonclient.grpc (or their aio forms)
    _general_client: Any  # tritonclient's InferenceServerClient; None once closed
    _infer_client: Any
    _model_config: TritonModelConfig | None
    _model_ready: bool | None
    _request_ids: itertools.count[int]
    _lazy_init: bool


def settings_of(client: Any) -> dict[str, Any]:
    """What ``from_existing_client`` copies from any model client: URL, model, version, timeouts,
    token, and its model configuration once read."""
    return {
        "url": client._url,
        "model_name": client._model_name,
        "model_version": client._model_version,
        "init_timeout_s": client._init_timeout_s,
        "inference_timeout_s": client._inference_timeout_s,
        "model_config": client._model_config,
        "access_token": client._access_token,
    }


def set_up(
    client: Any, url: str, model_name: str, model_version: str | None, init_timeout_s: float | None,
    inference_timeout_s: float | None, access_token: str | None, model_config: Any, ensure_model_is_ready: bool,
    lazy_init: bool,
) -> None:  # fmt: skip
    """The settings and the two tritonclient clients (one for set-up calls, one for inference)
    that every model client starts with; ``client`` provides ``get_lib`` and ``_new_client``."""
    client._triton_url = TritonUrl.from_url(url)
    client._url = url
    client._model_name = model_name
    client._model_version = None if model_version is None else str(model_version)
    client._init_timeout_s = DEFAULT_INIT_TIMEOUT_S if init_timeout_s is None else init_timeout_s
    client._inference_timeout_s = DEFAULT_INFERENCE_TIMEOUT_S if inference_timeout_s is None else inference_timeout_s
    client._headers = create_auth_headers(access_token, client._triton_url.scheme) if access_token is not None else None
    client._access_token = access_token
    client._lib = client.get_lib()
    client._general_client = client._new_client(min(DEFAULT_NETWORK_TIMEOUT_S, client._init_timeout_s))
    client._infer_client = client._new_client(client._inference_timeout_s)
    client._model_config = model_config
    client._model_ready = True if (model_config is not None and not ensure_model_is_ready) else None
    client._request_ids = itertools.count(0)
    client._lazy_init = lazy_init
