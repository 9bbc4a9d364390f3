"""Who may load and unload models over the network: Triton's model control modes.

As ``tritonserver`` (whose ``--model-control-mode`` defaults to ``none``), a server refuses
RepositoryModelLoad/RepositoryModelUnload and the HTTP repository load/unload unless the
application opts in with ``ServerConfig(model_control_mode="explicit")`` (``embedtriton serve
--model-control-mode explicit``): UNAVAILABLE (HTTP 503) "explicit model load / unload is not
allowed if polling is enabled", the words of Triton's core for NONE and POLL alike
(``ModelRepositoryManager::LoadUnloadModel``, r24.10). A refused request changes nothing: the
model stays loaded, with its config, and serves. The repository index stays readable, and in
process ``bind``, ``unbind``, ``load`` and ``unload`` of bound callables work in every mode.
Stock ``tritonclient`` on both endpoints, and ``embedtriton serve``."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from serving import Served

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

from embedtriton import ModelConfig, Server, ServerConfig, Tensor, batch  # noqa: E402

F32 = np.float32
X = [Tensor(name="x", dtype=F32, shape=(1,))]
Y = [Tensor(name="y", dtype=F32, shape=(1,))]
REFUSED = "explicit model load / unload is not allowed if polling is enabled"  # Triton's, for NONE and POLL


def _serve(counter, config: ServerConfig):
    calls = counter(lambda requests: [{"y": r["x"] * 2} for r in requests])
    server = Server(config)
    server.bind("Double", calls, X, Y, ModelConfig(max_batch_size=8))
    return server, calls


@pytest.fixture(scope="module", params=["default", "none", "poll"])
def refusing(request, counter):
    """A server in each mode that keeps network model control off: the default, and both of
    Triton's non-explicit modes said out loud."""
    config = ServerConfig() if request.param == "default" else ServerConfig(model_control_mode=request.param)
    server, calls = _serve(counter, config)
    with server:
        grpc_port = server.serve_grpc("127.0.0.1:0")
        http_port = server.serve_http("127.0.0.1:0")
        yield server, calls, grpc_port, http_port


@pytest.fixture(scope="module")
def explicit(counter):
    server, calls = _serve(counter, ServerConfig(model_control_mode="explicit"))
    with server:
        yield server, calls, server.serve_grpc("127.0.0.1:0"), server.serve_http("127.0.0.1:0")


def test_the_default_is_tritons_none():
    assert ServerConfig().model_control_mode == "none"


def _grpc_double(port: int) -> float:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.full((1, 1), 3, F32))
    return float(client.infer("Double", [x]).as_numpy("y")[0, 0])


def _unchanged(server: Server, calls, before: int, grpc_port: int) -> None:
    """The refused requests reached nothing: the model is READY with its config and serves."""
    model = server.model("Double")
    assert model.ready and model.config()["max_batch_size"] == 8
    assert calls.requests == before
    assert _grpc_double(grpc_port) == 6.0 and calls.requests == before + 1


GRPC_CONTROL = [
    ("load", lambda c: c.load_model("Double")),
    ("load-config", lambda c: c.load_model("Double", config=json.dumps({"max_batch_size": 2}))),
    ("unload", lambda c: c.unload_model("Double")),
    ("unload-dependents", lambda c: c.unload_model("Double", unload_dependents=True)),
    ("load-unknown", lambda c: c.load_model("Nope")),  # the mode is checked first, as in Triton's core
    ("unload-unknown", lambda c: c.unload_model("Nope")),
]


@pytest.mark.parametrize("call", [c for _, c in GRPC_CONTROL], ids=[n for n, _ in GRPC_CONTROL])
def test_grpc_model_control_is_refused_and_nothing_changes(refusing, call):
    server, calls, grpc_port, _ = refusing
    before = calls.requests
    with pytest.raises(InferenceServerException) as refused:
        call(grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}"))
    assert refused.value.status() == "StatusCode.UNAVAILABLE"
    assert refused.value.message() == REFUSED
    _unchanged(server, calls, before, grpc_port)


HTTP_CONTROL = [
    ("load", lambda c: c.load_model("Double")),
    ("load-config", lambda c: c.load_model("Double", config=json.dumps({"max_batch_size": 2}))),
    ("unload", lambda c: c.unload_model("Double")),
    ("unload-dependents", lambda c: c.unload_model("Double", unload_dependents=True)),
    ("load-unknown", lambda c: c.load_model("Nope")),
    ("unload-unknown", lambda c: c.unload_model("Nope")),
]


@pytest.mark.parametrize("call", [c for _, c in HTTP_CONTROL], ids=[n for n, _ in HTTP_CONTROL])
def test_http_model_control_is_refused_and_nothing_changes(refusing, call):
    server, calls, grpc_port, http_port = refusing
    before = calls.requests
    with pytest.raises(InferenceServerException) as refused:
        call(httpclient.InferenceServerClient(f"127.0.0.1:{http_port}"))
    assert refused.value.status() == "503"  # Triton's HttpCodeFromError for UNAVAILABLE
    assert refused.value.message() == REFUSED
    _unchanged(server, calls, before, grpc_port)


def test_the_repository_index_stays_readable(refusing):
    _, _, grpc_port, http_port = refusing
    grpc_index = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}").get_model_repository_index()
    assert [(m.name, m.state) for m in grpc_index.models] == [("Double", "READY")]
    http_index = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}").get_model_repository_index()
    assert [(m["name"], m["state"]) for m in http_index] == [("Double", "READY")]


def test_in_process_control_works_in_every_mode(refusing):
    """bind, unbind, load (with and without a config) and unload are the application's, not
    the network's: no mode stops them."""
    server, _, grpc_port, _ = refusing
    model = server.model("Double")
    server.unload("Double")
    assert not model.ready
    server.load("Double")
    assert model.ready and model.config()["max_batch_size"] == 8
    server.load("Double", config=ModelConfig(max_batch_size=4))
    assert model.config()["max_batch_size"] == 4 and _grpc_double(grpc_port) == 6.0
    server.load("Double", config=ModelConfig(max_batch_size=8))
    server.bind("Extra", batch(lambda x: {"y": x + 1}), X, Y, ModelConfig(max_batch_size=2))
    assert float(server.model("Extra").infer({"x": np.ones((1, 1), F32)})["y"][0, 0]) == 2.0
    server.unbind("Extra")
    assert [m.name for m in server.models()] == ["Double"] and model.ready


def test_explicit_mode_allows_model_control_over_grpc(explicit):
    server, _, grpc_port, _ = explicit
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    client.unload_model("Double")
    assert not client.is_model_ready("Double") and not server.model("Double").ready
    client.load_model("Double")
    assert client.is_model_ready("Double")
    client.load_model("Double", config=json.dumps({"max_batch_size": 4}))
    assert server.model("Double").config()["max_batch_size"] == 4 and _grpc_double(grpc_port) == 6.0
    with pytest.raises(InferenceServerException, match="failed to load 'Nope', failed to poll from model repository"):
        client.load_model("Nope")  # past the mode check: Triton's answer for a name it does not have
    client.unload_model("Nope")  # nothing to unload: success, as in Triton
    client.load_model("Double", config=json.dumps({"max_batch_size": 8}))


def test_explicit_mode_allows_model_control_over_http(explicit):
    server, _, grpc_port, http_port = explicit
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    client.unload_model("Double")
    assert not client.is_model_ready("Double") and not server.model("Double").ready
    client.load_model("Double", config=json.dumps({"max_batch_size": 4}))
    assert client.is_model_ready("Double") and server.model("Double").config()["max_batch_size"] == 4
    assert _grpc_double(grpc_port) == 6.0
    client.load_model("Double", config=json.dumps({"max_batch_size": 8}))


def test_a_restriction_is_checked_before_the_mode(counter):
    """As in Triton: a client without the model-repository header is refused for the header;
    one with it meets the mode."""
    server, calls = _serve(counter, ServerConfig())
    spec = "model-repository:admin=s3cret"
    with server:
        g = grpcclient.InferenceServerClient(f"127.0.0.1:{server.serve_grpc('127.0.0.1:0', restricted_protocol=spec)}")
        h = httpclient.InferenceServerClient(f"127.0.0.1:{server.serve_http('127.0.0.1:0', restricted_api=spec)}")
        for unload, header, restricted, status in (
            (g.unload_model, {"triton-grpc-protocol-admin": "s3cret"}, "This protocol is restricted", "StatusCode.UNAVAILABLE"),
            (h.unload_model, {"admin": "s3cret"}, "This API is restricted", "503"),
        ):  # fmt: skip
            with pytest.raises(InferenceServerException, match=restricted):
                unload("Double")
            with pytest.raises(InferenceServerException) as refused:
                unload("Double", headers=header)
            assert (refused.value.status(), refused.value.message()) == (status, REFUSED)
        assert server.model("Double").ready and calls.requests == 0


REPOSITORY_MODEL = """
import numpy as np
from embedtriton import ModelConfig, Tensor, batch

@batch
def infer_func(x):
    return {"y": x + 1}

inputs = [Tensor(name="x", dtype=np.float32, shape=(1,))]
outputs = [Tensor(name="y", dtype=np.float32, shape=(1,))]
config = ModelConfig(max_batch_size=8)
"""


def test_by_default_a_repository_is_loaded_at_start_and_stays_as_it_is(tmp_path):
    """Triton's NONE: every repository model loads at start; no client changes that."""
    (tmp_path / "Inc" / "1").mkdir(parents=True)
    (tmp_path / "Inc" / "1" / "model.py").write_text(REPOSITORY_MODEL)
    server = Server(ServerConfig(model_repository=[str(tmp_path)]))
    with server:
        assert server.model("Inc").ready
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.serve_grpc('127.0.0.1:0')}")
        for call in (lambda: client.unload_model("Inc"), lambda: client.load_model("Inc")):
            with pytest.raises(InferenceServerException, match=REFUSED):
                call()
        assert client.is_model_ready("Inc")
        assert float(server.model("Inc").infer({"x": np.ones((1, 1), F32)})["y"][0, 0]) == 2.0


MODELS = """
import numpy as np
from embedtriton import ModelConfig, Tensor, batch

def bind(server):
    server.bind("Double", batch(lambda x: {"y": x * 2}), [Tensor(name="x", dtype=np.float32, shape=(1,))],
                [Tensor(name="y", dtype=np.float32, shape=(1,))], ModelConfig(max_batch_size=4))
"""


def _http_port(served: Served) -> int:
    return int(next(line for line in served.lines if "serving HTTP" in line).rsplit("port ", 1)[1][:-2])


@pytest.mark.parametrize("flags", [[], ["--model-control-mode", "none"], ["--model-control-mode", "poll"]])
def test_serve_command_refuses_model_control_unless_told(tmp_path, flags):
    served = Served(tmp_path, textwrap.dedent(MODELS), "--http", "127.0.0.1:0", *flags)
    try:
        g = grpcclient.InferenceServerClient(served.address)
        h = httpclient.InferenceServerClient(f"127.0.0.1:{_http_port(served)}")
        for call in (
            lambda: g.unload_model("Double"),
            lambda: h.unload_model("Double"),
            lambda: h.load_model("Double"),
        ):
            with pytest.raises(InferenceServerException, match=REFUSED):
                call()
        assert g.is_model_ready("Double") and h.is_model_ready("Double")
    finally:
        served.close()


def test_serve_command_with_explicit_model_control(tmp_path):
    served = Served(tmp_path, textwrap.dedent(MODELS), "--http", "127.0.0.1:0", "--model-control-mode", "explicit")
    try:
        g = grpcclient.InferenceServerClient(served.address)
        h = httpclient.InferenceServerClient(f"127.0.0.1:{_http_port(served)}")
        g.unload_model("Double")
        assert not h.is_model_ready("Double")
        h.load_model("Double")
        assert g.is_model_ready("Double")
    finally:
        served.close()
