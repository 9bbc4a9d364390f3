"""HTTP/REST inference answered in C (native/_native/kserve.c, kserve_json.c): taken for plain
requests (JSON tensors and the binary tensor data extension), declined otherwise, and answering
exactly as the Python path does: the same status, header fields and body bytes."""

from __future__ import annotations

import http.client
import json
import threading
import time

import numpy as np
import pytest
from helpers import wait_for

httpclient = pytest.importorskip("tritonclient.http")

from embedtriton import ModelConfig, Server, ServerConfig, Tensor, _native, batch  # noqa: E402
from embedtriton.frontends.http.endpoint import RestEndpoint  # noqa: E402


@pytest.fixture(scope="module")
def served(add_sub, add_sub_tensors):
    def fails(requests):
        raise ValueError("no luck")

    def where(requests):  # how far each input is from its datatype's alignment
        return [{"off": np.array([r["x"].ctypes.data % 8], np.int64)} for r in requests]

    @batch
    def kinds(x, h):
        with np.errstate(over="ignore"):  # (2e5 is inf in float16: JSON's Infinity)
            return {"y": x * 2, "pos": x > 0, "u": (x % 7).astype(np.uint16), "h": (h * 2).astype(np.float16)}

    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    server.bind(
        "Kinds",
        kinds,
        [Tensor(name="x", dtype=np.int64, shape=(-1,)), Tensor(name="h", dtype=np.float64, shape=(-1,))],
        [Tensor(name="y", dtype=np.int64, shape=(-1,)), Tensor(name="pos", dtype=np.bool_, shape=(-1,)),
         Tensor(name="u", dtype=np.uint16, shape=(-1,)), Tensor(name="h", dtype=np.float16, shape=(-1,))],
        ModelConfig(max_batch_size=8),
    )  # fmt: skip
    server.bind(
        "Echo",
        batch(lambda x: {"y": x}),
        [Tensor(name="x", dtype=np.bytes_, shape=(-1,))],
        [Tensor(name="y", dtype=np.bytes_, shape=(-1,))],
        ModelConfig(max_batch_size=8),
    )
    server.bind("Fails", fails, [Tensor(name="x", dtype=np.int32, shape=(-1,))],
                [Tensor(name="y", dtype=np.int32, shape=(-1,))])  # fmt: skip
    server.bind("Where", where, [Tensor(name="x", dtype=np.float64, shape=(-1,))],
                [Tensor(name="off", dtype=np.int64, shape=(1,))], ModelConfig(batching=False))  # fmt: skip
    with server:
        port = server.serve_http("127.0.0.1:0")
        yield port, server.endpoint("http")


def post(port: int, url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, list, bytes]:
    """(status, header fields but Date, body) of one POST."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", url, body, headers or {})
        r = conn.getresponse()
        return r.status, sorted((k, v) for k, v in r.getheaders() if k != "Date"), r.read()
    finally:
        conn.close()


def both(served, url, body, headers=None):
    """The answer with the C path, the Python path's, and whether C took it."""
    port, endpoint = served
    taken = _native.http_stats()[0]
    in_c = post(port, url, body, headers)
    took = _native.http_stats()[0] > taken
    endpoint.use_c_path(False)
    try:
        in_python = post(port, url, body, headers)
    finally:
        endpoint.use_c_path(True)
    return in_c, in_python, took


def tensor(name, datatype, shape, data=None, binary=None):
    t = {"name": name, "datatype": datatype, "shape": shape}
    if binary is not None:
        t["parameters"] = {"binary_data_size": binary}
    else:
        t["data"] = data
    return t


ADD = "/v2/models/AddSub/infer"
PLAIN = [  # (url, request, binary bytes after the JSON)
    (ADD, {"inputs": [tensor("a", "FP32", [4, 1], [[0.1], [1], [2.5], [-3e-7]]), tensor("b", "FP32", [4, 1], [1, 2, 3, 4])]}, None),
    (ADD, {"id": "r1", "inputs": [tensor("a", "FP32", [2, 1], [1e30, 7]), tensor("b", "FP32", [2, 1], [3, 4])],
           "outputs": [{"name": "sub"}]}, None),
    ("/v2/models/AddSub/versions/1/infer", {"inputs": [tensor("a", "FP32", [2, 1], [1, 7]), tensor("b", "FP32", [2, 1], [3, 4])],
     "outputs": [{"name": "sub", "parameters": {"binary_data": True}}, {"name": "add"}]}, None),
    (ADD, {"inputs": [tensor("a", "FP32", [2, 1], [1, 7]), tensor("b", "FP32", [2, 1], [3, 4])],
           "parameters": {"binary_data_output": True}}, None),
    (ADD, {"inputs": [tensor("a", "FP32", [2, 1], binary=8), tensor("b", "FP32", [2, 1], [3, 4])], "extra": [{}]},
     np.array([1.5, 2], np.float32).tobytes()),
    ("/v2/models/Kinds/infer", {"inputs": [tensor("x", "INT64", [2, 2], [1, -2, 9007199254740993, 0]),
     tensor("h", "FP64", [2, 2], [0.5, 1e-9, 65504, 1e5])]}, None),
    (ADD, {"inputs": [tensor("a", "FP32", [2, 1], [1, 7])]}, None),  # Triton: a required input missing
    (ADD, {"inputs": [tensor("a", "FP32", [1, 3], [1, 7, 3]), tensor("b", "FP32", [1, 3], [3, 4, 5])]}, None),  # Triton: shape
    ("/v2/models/Fails/infer", {"inputs": [tensor("x", "INT32", [1, 1], [1])]}, None),  # the model raises
    (ADD, {"inputs": [tensor("a", "FP32", [9, 1], [1] * 9), tensor("b", "FP32", [9, 1], [1] * 9)]}, None),  # over max batch
    ("/v2/models/AddSub/versions/7/infer", {"inputs": [tensor("a", "FP32", [1, 1], [1]), tensor("b", "FP32", [1, 1], [1])]}, None),
]  # fmt: skip


def body_of(request, blob):
    data = json.dumps(request).encode()
    if blob is None:
        return data, {"Content-Type": "application/json"}
    return data + blob, {"Inference-Header-Content-Length": str(len(data))}


@pytest.mark.parametrize("case", range(len(PLAIN)))
def test_plain_requests_are_taken_and_answered_as_the_python_path_does(served, case):
    url, request, blob = PLAIN[case]
    body, headers = body_of(request, blob)
    in_c, in_python, took = both(served, url, body, headers)
    assert in_c == in_python
    assert took or in_c[0] != 200  # (Triton refusing a request as it is handed over: Python words it)
    if case < 6:
        assert took and in_c[0] == 200, in_c


DECLINED = [  # what the C path leaves to Python: it answers as before
    (ADD, b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 1], "data": [NaN]}]}', {}),
    (ADD, b'{"inputs": [{"name": "\\u0061", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}', {}),
    (ADD, b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 2], "data": [1]}]}', {}),
    (ADD, b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 1], "data": [1]}], "parameters": {"priority": 1}}', {}),
    (ADD, b'{"inputs": [], "outputs": [{"name": "add", "parameters": {"classification": 1}}]}', {}),
    (ADD, b'{"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 1], "data": [1]}', {}),
    (ADD, b'{"inputs": []}', {"Accept-Encoding": "gzip"}),
    (ADD + "?x=1", b'{"inputs": []}', {}),
    ("/v2/models/Echo/infer", b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 1], "data": ["a"]}]}', {}),
    ("/v2/models/Nope/infer", b'{"inputs": []}', {}),
    ("/v2/models/AddSub/versions/x/infer", b'{"inputs": []}', {}),
    (ADD, b'{"inputs": []}', {"Inference-Header-Content-Length": "99"}),
]  # fmt: skip


@pytest.mark.parametrize("case", range(len(DECLINED)))
def test_what_it_declines_still_runs_in_python(served, case):
    url, body, headers = DECLINED[case]
    declined = _native.http_stats()[1]
    in_c, in_python, took = both(served, url, body, headers)
    assert in_c == in_python and not took
    assert _native.http_stats()[1] > declined or "?" in url or headers.get("Accept-Encoding") or "x/" in url


ONE = json.dumps({"inputs": [tensor("a", "FP32", [1, 1], [1]), tensor("b", "FP32", [1, 1], [2])]}).encode()
VARIANTS = [  # URLs and header fields the IO thread reads before the C path: the same answers
    ("/v2/models/AddSub/infer/", ONE, {}),
    ("/v2/models//infer", ONE, {}),
    ("/v2/models/AddSub/versions//infer", ONE, {}),
    ("/v2/models/AddSub/versions/1/infer", ONE, {}),
    ("/v2/models/AddSub/versions/01/infer", ONE, {}),
    ("/v2/models/AddSub/versions/-1/infer", ONE, {}),
    ("/v2/models/AddSub/version/1/infer", ONE, {}),
    ("/v2/models/Add%53ub/infer", ONE, {}),
    ("/v2/models/AddSub/infer#x", ONE, {}),
    ("/v2/models/AddSub/infer?", ONE, {}),
    ("/v2/models/AddSub/inference", ONE, {}),
    ("/v2/models/" + "x" * 300 + "/infer", ONE, {}),
    ("/v2/models/AddSub/infer", ONE, {"ACCEPT-ENCODING": "GZip;q=1"}),
    ("/v2/models/AddSub/infer", ONE, {"Accept-Encoding": "identity"}),
    ("/v2/models/AddSub/infer", ONE, {"Content-Encoding": "identity"}),
    ("/v2/models/AddSub/infer", ONE, {"inference-header-content-length": str(len(ONE))}),
    ("/v2/models/AddSub/infer", ONE, {"Inference-Header-Content-Length": "+5"}),
    ("/v2/models/AddSub/infer", ONE, {"Inference-Header-Content-Length": "9" * 30}),
    ("/v2/models/AddSub/infer", ONE, {"Inference-Header-Content-Length": ""}),
]  # fmt: skip


@pytest.mark.parametrize("case", range(len(VARIANTS)))
def test_url_and_header_variants_answer_as_the_python_path(served, case):
    url, body, headers = VARIANTS[case]
    in_c, in_python, _ = both(served, url, body, headers)
    assert in_c == in_python


def test_the_c_path_is_off_for_forwarded_headers_restrictions_and_traces(add_sub, add_sub_tensors):
    """Where the endpoint does what only the Python path does, no request is taken in C."""
    from embedtriton import HttpOptions, Tracing

    cases = [
        (ServerConfig(), HttpOptions(header_forward_pattern="x-.*")),
        (ServerConfig(), HttpOptions(restricted_api="inference:x-key=secret")),
    ]
    try:
        import opentelemetry.trace  # noqa: F401

        cases.append((ServerConfig(tracing=Tracing()), HttpOptions()))
    except ImportError:  # (the tracing extra is not installed)
        pass
    for config, options in cases:
        server = Server(config)
        server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
        with server:
            port = server.serve_http("127.0.0.1:0", options=options)
            taken = _native.http_stats()[0]
            status, _, _ = post(port, ADD, ONE, {"x-key": "secret"})
            assert status == 200 and _native.http_stats()[0] == taken, options


def test_plain_requests_never_reach_python(served, monkeypatch):
    """The HTTP IO thread hands a plain /infer to the C handler before Python
    (``HttpServer.set_fast``): the endpoint's Python handler is not even called; a request the C
    path declines reaches it as before."""
    seen = []
    original = RestEndpoint._infer_now

    def infer_now(self, *args):
        seen.append(1)
        return original(self, *args)

    monkeypatch.setattr(RestEndpoint, "_infer_now", infer_now)
    taken = _native.http_stats()[0]
    status, _, answer = post(served[0], ADD, ONE)
    assert status == 200 and _native.http_stats()[0] == taken + 1 and seen == []
    assert [o["data"] for o in json.loads(answer)["outputs"]] == [[3.0], [-1.0]]
    status, _, _ = post(served[0], ADD, b'{"inputs": [], "parameters": {"priority": 1}}')
    assert status == 400 and seen == [1]


def test_stock_tritonclient_json_and_binary_tensors_are_taken(served):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{served[0]}")
    a = np.arange(8, dtype=np.float32).reshape(8, 1)
    for binary_in in (False, True):
        for binary_out in (False, True):
            inputs = [httpclient.InferInput("a", [8, 1], "FP32"), httpclient.InferInput("b", [8, 1], "FP32")]
            for t in inputs:
                t.set_data_from_numpy(a, binary_data=binary_in)
            outputs = [httpclient.InferRequestedOutput(n, binary_data=binary_out) for n in ("add", "sub")]
            taken = _native.http_stats()[0]
            result = client.infer("AddSub", inputs, outputs=outputs, request_id="r")
            assert _native.http_stats()[0] == taken + 1
            np.testing.assert_array_equal(result.as_numpy("add"), a * 2)
            np.testing.assert_array_equal(result.as_numpy("sub"), a * 0)
            assert result.get_response()["id"] == "r"
    client.close()


def test_inputs_reach_the_model_aligned(served):
    """Binary inputs not aligned in the body for their datatype are copied: the model's arrays
    are aligned on either path."""
    header = json.dumps({"inputs": [tensor("x", "FP64", [1], binary=8)]}).encode()
    for pad in range(4):
        head = header + b" " * pad  # moves the binary part
        status, _, answer = post(served[0], "/v2/models/Where/infer", head + np.float64(1.5).tobytes(),
                                 {"Inference-Header-Content-Length": str(len(head))})  # fmt: skip
        assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [0]


def test_many_concurrent_requests(served):
    taken = _native.http_stats()[0]
    errors: list[BaseException] = []

    def worker(k):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", served[0], timeout=30)
            for i in range(50):
                x = float(k * 100 + i)
                body = json.dumps({"inputs": [tensor("a", "FP32", [1, 1], [x]), tensor("b", "FP32", [1, 1], [1])]})
                conn.request("POST", ADD, body)
                r = conn.getresponse()
                outputs = json.loads(r.read())["outputs"]
                assert r.status == 200 and outputs[0]["data"] == [x + 1] and outputs[1]["data"] == [x - 1]
            conn.close()
        except BaseException as exc:  # (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[0]
    assert _native.http_stats()[0] - taken == 400


def test_memory_stays_flat_over_many_requests_answered_in_c(add_sub, add_sub_tensors):
    """Each request answered in C lets go of its body, its HTTP call and its Triton request and
    response: 2,000 requests of 64 KiB leave the resident size where it was."""

    def resident_kib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4

    request = {"inputs": [tensor("a", "FP32", [8, 1], [1] * 8), tensor("b", "FP32", [8, 1], [2] * 8)],
               "padding": "x" * 65536}  # fmt: skip
    body = json.dumps(request).encode()
    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    with server:
        port = server.serve_http("127.0.0.1:0")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

        def ask():
            conn.request("POST", ADD, body)
            r = conn.getresponse()
            r.read()
            assert r.status == 200

        for _ in range(300):
            ask()
        taken, before = _native.http_stats()[0], resident_kib()
        for _ in range(2000):
            ask()
        grown = resident_kib() - before
        conn.close()
    assert _native.http_stats()[0] - taken == 2000
    assert grown < 32 * 1024, grown  # (a leak of the bodies alone would be 125 MiB)


def test_stopping_lets_go_of_the_calls_answered_in_c(add_sub, add_sub_tensors):
    """A call answered in C is let go of (its body, its HTTP call) when the next request is taken;
    the last ones wait for the endpoint's stop, which lets go of them as the gRPC endpoint's
    does, instead of holding them until some later request."""
    body = json.dumps({"inputs": [tensor("a", "FP32", [1, 1], [1]), tensor("b", "FP32", [1, 1], [2])]}).encode()
    server = Server()
    server.bind("AddSub", add_sub, *add_sub_tensors, config=ModelConfig(max_batch_size=8))
    with server:
        port = server.serve_http("127.0.0.1:0")
        taken = _native.http_stats()[0]
        for _ in range(3):
            assert post(port, ADD, body)[0] == 200
        assert _native.http_stats()[0] - taken == 3
    assert _native.release_answered() == 0


@pytest.mark.parametrize("in_c", [True, False])
def test_stop_with_requests_in_flight_answers_them_as_the_python_path(in_c):
    """Stopping while requests wait on a slow model (exit_timeout_secs=1): each gets the same
    answer on either path (503 and the same words); nobody hangs, the server stops."""
    release = threading.Event()

    def slow(requests):
        release.wait(5)
        return [{"y": r["x"]} for r in requests]

    server = Server(ServerConfig(exit_timeout_secs=1))
    server.bind("Slow", slow, [Tensor(name="x", dtype=np.int32, shape=(1,))],
                [Tensor(name="y", dtype=np.int32, shape=(1,))], ModelConfig(batching=False))  # fmt: skip
    outcomes: list[tuple[int, list, bytes]] = []
    taken = _native.http_stats()[0]
    body = json.dumps({"inputs": [tensor("x", "INT32", [1], [1])]}).encode()
    with server:
        port = server.serve_http("127.0.0.1:0")
        server.endpoint("http").use_c_path(in_c)
        threads = [threading.Thread(target=lambda: outcomes.append(post(port, "/v2/models/Slow/infer", body)))
                   for _ in range(3)]  # fmt: skip
        for t in threads:
            t.start()
        # (asserted once the callers are answered)
        all_in = wait_for(lambda: _native.pending(server._handle)[0] == 3)
        started = time.monotonic()
    release.set()
    for t in threads:
        t.join(30)
    assert all_in, "the 3 calls were not all in flight before stop()"
    assert time.monotonic() - started < 15
    assert len(outcomes) == 3
    for status, _, answer in outcomes:
        assert status == 503 and json.loads(answer) == {"error": "the server stopped before this request completed"}
    assert (_native.http_stats()[0] - taken == 3) == in_c
