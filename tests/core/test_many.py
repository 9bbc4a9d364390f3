"""Many requests from one call: ``Model.infer_many``."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from embedtriton import InvalidArgumentError, ModelConfig, TritonError, UnavailableError

F32 = np.float32


def pair(i: float) -> dict[str, np.ndarray]:
    return {"a": np.full((1, 1), i, F32), "b": np.full((1, 1), 1.0, F32)}


@pytest.mark.parametrize("window", [1, 2, 7, 64])
def test_infer_many_returns_every_output_in_order(add_sub_counted, window):
    model, counted = add_sub_counted
    results = model.infer_many([pair(i) for i in range(300)], max_in_flight=window)
    assert [float(r["add"][0, 0]) for r in results] == [i + 1.0 for i in range(300)]
    assert [float(r["sub"][0, 0]) for r in results] == [i - 1.0 for i in range(300)]
    assert counted.requests == 300
    if window > 1:
        assert counted.batches < 300  # requests in flight together were batched


def test_infer_many_takes_any_iterable_of_mappings(server):
    from types import MappingProxyType

    results = server.model("AddSub").infer_many(MappingProxyType(pair(i)) for i in range(5))
    assert [float(r["add"][0, 0]) for r in results] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert server.model("AddSub").infer_many([]) == []


def test_infer_many_options_apply_to_every_request(server):
    results = server.model("AddSub").infer_many([pair(i) for i in range(10)], outputs=["sub"], priority=0)
    assert all(set(r) == {"sub"} for r in results)


def test_a_failed_request_fails_alone(server):
    items = [pair(i) for i in range(20)]
    items[7] = {"a": np.ones((1, 1), np.float64), "b": np.ones((1, 1), F32)}  # wrong dtype
    items[13] = {"a": np.ones((1, 1), F32)}  # an input missing
    for window in (64, 4, 3):  # (Triton refuses them as a refill is handed over: they leave the window)
        results = server.model("AddSub").infer_many(items, return_exceptions=True, max_in_flight=window)
        assert isinstance(results[7], InvalidArgumentError) and "astype(np.float32)" in str(results[7])
        assert isinstance(results[13], TritonError)
        assert [float(results[i]["add"][0, 0]) for i in range(20) if i not in (7, 13)] == [
            i + 1.0 for i in range(20) if i not in (7, 13)
        ]
    # without return_exceptions: the first error, raised once every request finished
    with pytest.raises(InvalidArgumentError, match="float32"):
        server.model("AddSub").infer_many(items)
    assert server.model("AddSub").infer(pair(2))["add"][0, 0] == 3.0  # it keeps serving


def test_infer_many_refuses_what_is_per_request(server):
    model = server.model("AddSub")
    with pytest.raises(InvalidArgumentError, match="request_id or correlation_id"):
        model.infer_many([pair(1)], request_id="x")
    with pytest.raises(InvalidArgumentError, match="request_id or correlation_id"):
        model.infer_many([pair(1)], correlation_id=3)
    for bad in (0, -1, 70000, 2.5, True):
        with pytest.raises(InvalidArgumentError, match="max_in_flight"):
            model.infer_many([pair(1)], max_in_flight=bad)
    with pytest.raises(InvalidArgumentError, match="mapping of input name"):
        model.infer_many([pair(1), [1, 2]])
    with pytest.raises(InvalidArgumentError, match="unknown request option"):
        model.infer_many([pair(1)], bogus=1)


def test_infer_many_from_threads_at_once(server):
    model, out, errors = server.model("AddSub"), {}, []

    def run(k: int) -> None:
        try:
            out[k] = model.infer_many([pair(k * 1000 + i) for i in range(200)], max_in_flight=16)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for k in range(4):
        assert [float(r["add"][0, 0]) for r in out[k]] == [k * 1000 + i + 1.0 for i in range(200)]


def test_infer_many_on_a_stopped_server_fails_each_request():
    from embedtriton import Server, Tensor, batch

    srv = Server()
    srv.bind(
        "M",
        batch(lambda x: {"y": x}),
        [Tensor(name="x", dtype=F32, shape=(1,))],
        [Tensor(name="y", dtype=F32, shape=(1,))],
        ModelConfig(max_batch_size=4),
    )
    with srv:
        model = srv.model("M")
        assert float(model.infer_many([{"x": np.ones((1, 1), F32)}])[0]["y"][0, 0]) == 1.0
    with pytest.raises(UnavailableError):
        model.infer_many([{"x": np.ones((1, 1), F32)}])


def test_infer_many_checks_its_options_as_infer_does(server):
    model = server.model("AddSub")
    for bad in ({"outputs": 5}, {"priority": -1}, {"timeout_us": -3}, {"parameters": [1, 2]}):
        with pytest.raises(InvalidArgumentError) as one:
            model.infer(pair(1), **bad)
        with pytest.raises(InvalidArgumentError) as many:
            model.infer_many([pair(1)], **bad)
        assert str(many.value) == str(one.value), bad


def test_infer_many_names_a_missing_required_input_as_infer_does():
    from embedtriton import Server, Tensor

    def scaled(requests):
        return [{"y": r["x"] * (r["scale"] if "scale" in r else 2)} for r in requests]

    srv = Server()
    srv.bind(
        "Scaled",
        scaled,
        [Tensor(name="x", dtype=F32, shape=(1,)), Tensor(name="scale", dtype=F32, shape=(1,), optional=True)],
        [Tensor(name="y", dtype=F32, shape=(1,))],
        ModelConfig(max_batch_size=4),
    )
    x, three = np.ones((1, 1), F32), np.full((1, 1), 3, F32)
    with srv:
        model = srv.model("Scaled")
        got = model.infer_many([{"x": x}, {"x": x, "scale": three}])
        assert [float(r["y"][0, 0]) for r in got] == [2.0, 3.0]  # the optional input left out, then given
        with pytest.raises(InvalidArgumentError) as one:
            model.infer({"scale": three})
        with pytest.raises(InvalidArgumentError) as many:
            model.infer_many([{"x": x}, {"scale": three}])
    assert "missing required input(s) ['x']" in str(one.value)
    assert str(many.value) == str(one.value)


def test_parameters_of_any_mapping_reach_every_request():
    from types import MappingProxyType

    from embedtriton import Server, Tensor

    def echo(requests):
        return [{"y": np.array([[r.parameters.get("k", 0)]], F32)} for r in requests]

    srv = Server()
    srv.bind(
        "Echo",
        echo,
        [Tensor(name="x", dtype=F32, shape=(1,))],
        [Tensor(name="y", dtype=F32, shape=(1,))],
        ModelConfig(max_batch_size=4),
    )
    with srv:
        got = srv.model("Echo").infer_many([{"x": np.ones((1, 1), F32)}] * 3, parameters=MappingProxyType({"k": 7}))
    assert [float(r["y"][0, 0]) for r in got] == [7.0, 7.0, 7.0]


def test_the_native_calls_take_one_request_object(server):
    """submit() and submit_many() read an InferRequest's fields themselves (submit() takes a
    dict as the inputs of a request without options): submit_many's template carries the
    shared options; its per-request parameters replace the shared ones."""
    from embedtriton.backend import library
    from embedtriton.core.request import InferRequest

    native = library._native or library.native()
    model = server.model("AddSub")
    handle = model._server._handle
    out = native.submit(handle, "AddSub", -1, InferRequest(pair(2), outputs=["add"]), None, None, False, False, False)
    assert list(out) == ["add"] and float(out["add"][0, 0]) == 3.0
    template = InferRequest({}, outputs=("sub",), parameters={"k": 1})
    got = native.submit_many(handle, "AddSub", -1, template, [pair(1), pair(3)], [None, {"j": 2}], None, 4, False)
    assert [list(r) for r in got] == [["sub"], ["sub"]]
    out = native.submit(handle, "AddSub", -1, pair(1), None, None, False, False, False)  # inputs alone
    assert sorted(out) == ["add", "sub"] and float(out["add"][0, 0]) == 2.0
    with pytest.raises(TypeError, match="the request must be an InferRequest, not list"):
        native.submit(handle, "AddSub", -1, [pair(1)], None, None, False, False, False)
    with pytest.raises(TypeError, match="bad arguments"):  # (one entry of parameters per request)
        native.submit_many(handle, "AddSub", -1, template, [pair(1), pair(3)], [None], None, 4, False)


def test_every_kind_of_input_arrives_as_infer_sends_it():
    """infer_many adds a request's C-contiguous numpy inputs as it hands the refill to Triton,
    without the GIL; strided, Fortran-ordered, byte-swapped, list and BYTES inputs are turned
    into arrays first, as infer() does. Mixed in one request and across requests, each must
    arrive with its own values (an input taken by the wrong route would be read with the
    wrong strides or byte order)."""
    from embedtriton import Server, Tensor

    def mix(requests):
        return [
            {"flat": r["x"].ravel().astype(np.float64), "joined": np.array([b"|".join(r["s"])], object)}
            for r in requests
        ]

    srv = Server()
    srv.bind(
        "Mix",
        mix,
        [Tensor(name="x", dtype=np.float64, shape=(-1, -1)), Tensor(name="s", dtype=np.bytes_, shape=(-1,))],
        [Tensor(name="flat", dtype=np.float64, shape=(-1,)), Tensor(name="joined", dtype=np.bytes_, shape=(1,))],
        ModelConfig(batching=False),
    )
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    xs = [
        base,  # contiguous
        base.T,  # Fortran order
        base[:, ::2],  # strided
        base.astype(">f8"),  # big-endian
        [[1.5, 2.5], [3.5, 4.5]],  # a list
        np.ascontiguousarray(base[1:]),  # contiguous again
    ]
    items = [{"x": x, "s": np.array([b"k%d" % i, b"v"], object)} for i, x in enumerate(xs)]
    with srv:
        model = srv.model("Mix")
        for window in (1, 4, 64):
            results = model.infer_many(items * 5, max_in_flight=window)
            for i, r in enumerate(results):
                x, expected = xs[i % len(xs)], model.infer(items[i % len(xs)])
                np.testing.assert_array_equal(r["flat"], np.asarray(x, np.float64).ravel())
                np.testing.assert_array_equal(r["flat"], expected["flat"])
                assert r["joined"].tolist() == [b"k%d|v" % (i % len(xs))]
