"""A plain ``@batch`` function is called by the native backend itself, straight from Triton's
buffers (native/_native/fast_batch.c): no Request objects, no Python wrapper. These tests pin
that it is taken where it applies, that it behaves as the general path (the wrapper in
embedtriton/backend/batch.py) in every case, and that the batches it declines still work."""

from __future__ import annotations

import inspect
import threading

import numpy as np
import pytest

from embedtriton import DynamicBatcher, ModelConfig, Server, Tensor, TritonError, batch

F32 = np.float32
DELAY = ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=200000))


def callers() -> list[str]:
    """The Python frames above the function that calls this (innermost first)."""
    return [f.function for f in inspect.stack()[2:]]


@pytest.fixture(scope="module")
def srv():
    s = Server()
    with s:
        yield s


def bind(srv, name, func, config=DELAY, dims=(-1,), out_dtype=F32):
    srv.bind(
        name,
        func,
        [Tensor(name="x", dtype=F32, shape=dims), Tensor(name="w", dtype=F32, shape=dims)],
        [Tensor(name="y", dtype=out_dtype, shape=dims)],
        config,
    )
    return srv.model(name)


def together(model, inputs: list[dict], **options) -> list:
    """Send the requests at once from threads (so the batcher's delay joins them); each one's
    outputs or exception."""
    results: list = [None] * len(inputs)
    barrier = threading.Barrier(len(inputs))

    def go(i: int) -> None:
        barrier.wait()
        try:
            results[i] = model.infer(inputs[i], **options)
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def rows(i: int, n: int = 1, width: int = 2) -> dict:
    return {"x": np.full((n, width), i, F32), "w": np.ones((n, width), F32)}


def test_a_plain_batch_function_runs_without_the_python_wrapper(srv):
    seen = []

    @batch
    def f(x, w):
        seen.append(callers())
        return {"y": x + w}

    model = bind(srv, "FastOne", f)
    assert model.infer(rows(3))["y"].tolist() == [[4.0, 4.0]]
    assert "run" not in seen[-1] and "execute" not in seen[-1]  # neither the wrapper nor the runner


def test_a_batch_of_several_requests_is_joined_and_split_in_order(srv):
    shapes = []

    @batch
    def f(x, w):
        shapes.append((x.shape, x.flags.writeable, callers()))
        return {"y": x * 10 + w}

    model = bind(srv, "FastMany", f)
    results = together(model, [rows(i, n=1 + i % 3) for i in range(6)])
    for i, r in enumerate(results):
        assert r["y"].shape == (1 + i % 3, 2) and np.all(r["y"] == i * 10 + 1), (i, r)
    joined = [s for s in shapes if s[0][0] > 3]
    assert joined, shapes  # some batches held several requests
    assert all(writable and "run" not in frames for _, writable, frames in joined)  # (new arrays, as np.concatenate's)


def test_parameters_come_per_request(srv):
    got = []

    @batch
    def f(x, w, parameters):
        got.append(parameters)
        return {"y": x + np.array([[p.get("k", 0)] for p in parameters for _ in range(1)], F32)}

    model = bind(srv, "FastParams", f)
    results = together(model, [rows(0) for _ in range(4)], parameters={"k": 5})
    assert all(r["y"].tolist() == [[5.0, 5.0]] for r in results)
    assert all(p == {"k": 5} for batch_ in got for p in batch_)


def test_outputs_that_are_not_numpy_arrays_are_split_by_the_wrapper_code(srv):
    @batch
    def f(x, w):
        return {"y": [[F32(v) for v in row] for row in x + w]}  # a list: split through split_outputs

    model = bind(srv, "FastList", f)
    results = together(model, [rows(i) for i in range(4)])
    assert [r["y"].tolist() for r in results] == [[[i + 1.0] * 2] for i in range(4)]


def test_errors_read_as_on_the_general_path(srv):
    @batch
    def raises(x, w):
        raise ValueError("boom")

    @batch
    def not_a_dict(x, w):
        return [x]

    @batch
    def nothing(x, w):
        return None

    @batch
    def too_few_rows(x, w):
        return {"y": x[:1]}

    with pytest.raises(
        TritonError, match=r"model 'FastRaises' raised ValueError: boom \(at test_batch_fast_path.py:\d+ in raises\)"
    ):
        bind(srv, "FastRaises", raises).infer(rows(1))
    with pytest.raises(
        TritonError, match="model 'FastList2' raised TypeError: a @batch function must return a dict of arrays"
    ):
        bind(srv, "FastList2", not_a_dict).infer(rows(1))
    with pytest.raises(TritonError, match="must return one dict of outputs per request; got NoneType for request 0"):
        bind(srv, "FastNone", nothing).infer(rows(1))
    # several requests: the first one's rows are right, the others get their shape error
    results = together(bind(srv, "FastRows", too_few_rows), [rows(i, n=2) for i in range(3)])
    errors = [r for r in results if isinstance(r, Exception)]
    assert errors and all("returned output 'y' with shape" in str(e) for e in errors), results
    srv.model("FastRows").infer(rows(1, n=1))  # it keeps serving


def test_a_kept_input_view_gets_its_own_copy(srv):
    kept = []

    @batch
    def f(x, w):
        kept.append(x)
        assert not x.flags.writeable  # a view of the caller's memory, read-only
        return {"y": x + w}

    model = bind(srv, "FastKeep", f)
    data = rows(7)
    model.infer(data)
    data["x"][...] = -1  # the caller reuses its array: what the function kept is unchanged
    assert kept[-1].tolist() == [[7.0, 7.0]]


def test_batches_the_fast_path_declines_take_the_general_path(srv):
    frames = []

    @batch
    def f(x, w):
        frames.append(callers())
        return {"y": x + w}

    model = bind(srv, "FastDeclined", f, dims=(-1,))
    # rows of different widths cannot be joined: each request alone through the wrapper's
    # np.concatenate error, as before
    results = together(model, [rows(1, width=2), rows(2, width=3)])
    for r in results:
        assert isinstance(r, dict) or "all the input array dimensions" in str(r), r
    # a timeout carries a deadline to the function: that request takes the general path (which
    # sets `deadline` while the function runs), the next one without a timeout does not
    model.infer(rows(1), timeout_us=10_000_000)
    assert "run" in frames[-1]
    model.infer(rows(1))
    assert "run" not in frames[-1]


def test_a_generator_or_raw_callable_is_not_called_from_c(srv):
    frames = []

    def raw(requests):
        frames.append(callers())
        return [{"y": r["x"] + r["w"]} for r in requests]

    model = bind(srv, "FastRaw", raw)
    assert model.infer(rows(2))["y"].tolist() == [[3.0, 3.0]]
    assert "execute" in frames[-1]
