"""PyTriton 0.7's security on embedtriton: ``Triton(security_config=TritonSecurityConfig(...))``
(by default a generated token guarding shared memory, the model repository, statistics, trace
and logging on both endpoints), ``TritonConfig``'s restricted APIs and header-forward patterns,
the clients' ``access_token`` (ours and PyTriton's own), and PyTriton's
``use_parameters_and_headers`` example."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from embedtriton.pytriton.client import ModelClient
from embedtriton.pytriton.client.auth import create_auth_headers, extract_access_token_from_headers
from embedtriton.pytriton.decorators import batch
from embedtriton.pytriton.exceptions import PyTritonValidationError
from embedtriton.pytriton.model_config import ModelConfig, Tensor
from embedtriton.pytriton.triton import (
    DEFAULT_PROTECTED_ENDPOINTS,
    TRITON_ACCESS_HEADER,
    Triton,
    TritonConfig,
    TritonSecurityConfig,
)

F32 = np.float32
X = [Tensor(name="x", dtype=F32, shape=(1,))]
Y = [Tensor(name="y", dtype=F32, shape=(1,))]


@batch
def double(x):
    return {"y": x * 2}


def _clients(triton):
    return (
        httpclient.InferenceServerClient(f"127.0.0.1:{triton.http_port}"),
        grpcclient.InferenceServerClient(f"127.0.0.1:{triton.grpc_port}"),
    )


def test_the_default_is_pytritons_generated_token_on_five_groups(local_config):
    assert DEFAULT_PROTECTED_ENDPOINTS == ["shared-memory", "model-repository", "statistics", "trace", "logging"]
    with Triton(config=local_config()) as triton:
        triton.bind("Double", double, X, Y, config=ModelConfig(max_batch_size=4))
        token = triton.get_access_token()
        assert isinstance(token, str) and len(token) >= 43  # secrets.token_urlsafe(32)
        http, grpc = _clients(triton)
        for call in (
            lambda: http.get_inference_statistics("Double"),
            lambda: http.get_model_repository_index(),
            lambda: http.get_log_settings(),
            lambda: http.get_system_shared_memory_status(),
        ):
            with pytest.raises(
                InferenceServerException, match="This API is restricted, expecting header 'triton-access-token'"
            ):
                call()
        with pytest.raises(
            InferenceServerException, match="expecting header 'triton-grpc-protocol-triton-access-token'"
        ):
            grpc.get_inference_statistics("Double")
        with pytest.raises(
            InferenceServerException, match="expecting header 'triton-grpc-protocol-triton-access-token'"
        ):
            grpc.unload_model("Double")
        assert http.get_inference_statistics("Double", headers={TRITON_ACCESS_HEADER: token})["model_stats"]
        grpc_headers = create_auth_headers(token, "grpc")
        assert grpc.get_system_shared_memory_status(headers=grpc_headers).regions == {}  # on, behind the token
        # open: health, metadata, model config and inference, which clients use without a token
        assert http.is_server_ready() and grpc.is_model_ready("Double")
        assert grpc.get_model_config("Double").config.max_batch_size == 4
        with ModelClient(f"127.0.0.1:{triton.http_port}", "Double") as client:
            assert client.infer_sample(np.array([2.0], F32))["y"][0] == 4.0
    assert Triton(config=local_config()).get_access_token() != token  # a new one each time


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_client_sends_the_token_as_pytriton_does(local_config, url_of, protocol, stock_pytriton):
    security = TritonSecurityConfig(access_token="t0ken", restricted_endpoints=["inference", "model-repository"])
    with Triton(config=local_config(), security_config=security) as triton:
        triton.bind("Double", double, X, Y, config=ModelConfig(max_batch_size=4))
        assert triton.get_access_token() == "t0ken"
        url = url_of(triton, protocol)
        with ModelClient(url, "Double") as client, pytest.raises(Exception, match="restricted"):
            client.infer_sample(np.array([1.0], F32))
        with ModelClient(url, "Double", access_token="t0ken") as client:
            assert client.infer_sample(np.array([1.0], F32))["y"][0] == 2.0
            client.unload_model()
            assert not triton.server.model("Double").ready
            client.load_model()
            assert triton.server.model("Double").ready
        stock = stock_pytriton("client")
        if stock is None:
            pytest.skip("PyTriton's own client needs its own dependencies (typing_inspect, ...) installed")
        with stock.ModelClient(url, "Double", access_token="t0ken", init_timeout_s=30) as client:
            assert client.infer_sample(np.array([3.0], F32))["y"][0] == 6.0


REPOSITORY_MODEL = """
import numpy as np
from embedtriton import ModelConfig, Tensor, batch

@batch
def infer_func(x):
    return {"y": x + 1}

inputs = [Tensor(name="x", dtype=np.float32, shape=(1,))]
outputs = [Tensor(name="y", dtype=np.float32, shape=(1,))]
config = ModelConfig(max_batch_size=4)
"""


def test_model_control_is_pytritons_explicit_with_every_repository_model_loaded(local_config, tmp_path):
    """PyTriton runs tritonserver with --model-control-mode=explicit --load-model=*: a repository's
    models load at start, and clients with the token load and unload models (bound ones too)."""
    (tmp_path / "Inc" / "1").mkdir(parents=True)
    (tmp_path / "Inc" / "1" / "model.py").write_text(REPOSITORY_MODEL)
    with Triton(config=local_config(model_repository=tmp_path)) as triton:
        triton.bind("Double", double, X, Y, config=ModelConfig(max_batch_size=4))
        assert triton.server.config.model_control_mode == "explicit"
        assert triton.server.model("Inc").ready  # loaded at start, as with --load-model=*
        _, grpc = _clients(triton)
        token = create_auth_headers(triton.get_access_token(), "grpc")
        with pytest.raises(InferenceServerException, match="restricted"):
            grpc.unload_model("Inc")
        for name in ("Inc", "Double"):
            grpc.unload_model(name, headers=token)
            assert not grpc.is_model_ready(name)
            grpc.load_model(name, headers=token)
            assert grpc.is_model_ready(name)


def test_an_empty_endpoint_list_restricts_nothing_and_tritonconfig_applies(local_config, caplog):
    config = local_config(http_restricted_api="model-config:k=v", grpc_restricted_protocol="model-config:k=v")
    open_security = TritonSecurityConfig(restricted_endpoints=[])
    assert open_security.access_token is None
    with Triton(config=config, security_config=open_security) as triton:
        triton.bind("Double", double, X, Y, config=ModelConfig(max_batch_size=4))
        assert triton.get_access_token() is None
        http, grpc = _clients(triton)
        with pytest.raises(InferenceServerException, match="expecting header 'k'"):
            http.get_model_config("Double")
        with pytest.raises(InferenceServerException, match="expecting header 'triton-grpc-protocol-k'"):
            grpc.get_model_config("Double")
        assert grpc.get_model_config("Double", headers={"triton-grpc-protocol-k": "v"}).config.name == "Double"
        assert http.get_inference_statistics("Double")["model_stats"]  # no token needed now
    with caplog.at_level(logging.WARNING, logger="embedtriton.pytriton"):  # a token replaces them, as in PyTriton
        triton = Triton(config=config, security_config=TritonSecurityConfig(access_token="a"))
    assert "replaced by the security config's restriction" in caplog.text
    assert triton._plan.http_settings["restricted_api"] == (
        "shared-memory,model-repository,statistics,trace,logging:triton-access-token=a",
    )
    assert triton._plan.grpc["restricted_protocol"] == triton._plan.http_settings["restricted_api"]


def test_invalid_settings_are_refused_at_construction(local_config, monkeypatch):
    with pytest.raises(PyTritonValidationError, match="Invalid endpoint names: infer, x. Valid endpoints are: health"):
        TritonSecurityConfig(restricted_endpoints=["inference", "infer", "x"])
    with pytest.raises(PyTritonValidationError, match="unknown restricted api 'infer'"):
        Triton(config=local_config(http_restricted_api="infer:k=v"), security_config=TritonSecurityConfig([]))
    with pytest.raises(PyTritonValidationError, match="--grpc-restricted-protocol option format"):
        Triton(config=local_config(grpc_restricted_protocol="inference"), security_config=TritonSecurityConfig([]))
    with pytest.raises(PyTritonValidationError, match="not a valid regular expression"):
        Triton(config=local_config(grpc_header_forward_pattern="("))
    monkeypatch.setenv("PYTRITON_TRITON_CONFIG_HTTP_RESTRICTED_API", "inference,health:k=v")
    assert TritonConfig.from_env().http_restricted_api == "inference,health:k=v"  # one spec, commas and all


def test_auth_helpers_are_pytritons():
    assert create_auth_headers("t", "http") == {"triton-access-token": "t"}
    assert create_auth_headers("t", "GRPC") == {"triton-grpc-protocol-triton-access-token": "t"}
    with pytest.raises(ValueError, match="cannot be None or empty"):
        create_auth_headers("", "http")
    with pytest.raises(ValueError, match="Must be 'http' or 'grpc'"):
        create_auth_headers("t", "https")
    assert extract_access_token_from_headers({"triton-grpc-protocol-triton-access-token": "g"}) == "g"
    assert extract_access_token_from_headers({"other": "x"}) is None
    with pytest.raises(ValueError, match="Conflicting authentication headers"):
        extract_access_token_from_headers({"triton-access-token": "a", "triton-grpc-protocol-triton-access-token": "b"})


def _infer_with_params_and_headers(requests):
    """PyTriton's examples/use_parameters_and_headers/server.py callable."""
    responses = []
    for req in requests:
        a_batch, b_batch = req.values()
        scaled_add_batch = (a_batch + b_batch) / float(req.parameters["header_divisor"])
        scaled_sub_batch = (a_batch - b_batch) * float(req.parameters["parameter_multiplier"])
        responses.append({"scaled_add": scaled_add_batch, "scaled_sub": scaled_sub_batch})
    return responses


def test_pytritons_use_parameters_and_headers_example(local_config, stock_pytriton):
    with Triton(config=local_config(http_header_forward_pattern="header.*")) as triton:
        triton.bind(
            model_name="ParamsAndHeaders",
            infer_func=_infer_with_params_and_headers,
            inputs=[Tensor(dtype=F32, shape=(-1,)), Tensor(dtype=F32, shape=(-1,))],
            outputs=[
                Tensor(name="scaled_add", dtype=F32, shape=(-1,)),
                Tensor(name="scaled_sub", dtype=F32, shape=(-1,)),
            ],
            config=ModelConfig(max_batch_size=128),
            strict=True,
        )
        a_batch = np.ones((2, 1), dtype=F32) * 2
        b_batch = np.ones((2, 1), dtype=F32)
        clients = [ModelClient]
        stock = stock_pytriton("client")  # PyTriton's own client too, where its dependencies are installed
        if stock is not None:
            clients.append(stock.ModelClient)
        for client_class in clients:
            with client_class(f"127.0.0.1:{triton.http_port}", "ParamsAndHeaders") as client:
                result = client.infer_batch(
                    a_batch, b_batch, parameters={"parameter_multiplier": 2}, headers={"header_divisor": 3}
                )
            np.testing.assert_allclose(result["scaled_add"], [[1.0], [1.0]])
            np.testing.assert_allclose(result["scaled_sub"], [[2.0], [2.0]])
