"""Bad input never reaches the callable and never hangs; model failures stay isolated."""

from __future__ import annotations

import re

import numpy as np
import pytest

from embedtriton import (
    InternalError,
    InvalidArgumentError,
    ModelConfig,
    NotFoundError,
    Server,
    Tensor,
    TritonError,
    UnavailableError,
    batch,
)
from embedtriton.triton.runtime import HOME_VARIABLE, find_runtime

ONE = np.ones((1, 1), np.float32)


@pytest.fixture
def counted(server, add_sub, add_sub_tensors, counter):
    counted = counter(add_sub)
    inputs, outputs = add_sub_tensors
    server.bind("Guarded", counted, inputs, outputs, ModelConfig(max_batch_size=8))
    yield server.model("Guarded"), counted
    server.unbind("Guarded")


@pytest.mark.parametrize(
    "inputs, message",
    [
        (
            {"a": np.ones((1, 1), np.float64), "b": ONE},
            r"^model 'Guarded': input 'a' is float64 but the model takes float32: pass a.astype\(np.float32\)$",
        ),
        (
            {"a": np.ones((1, 2), np.float32), "b": ONE},
            r"^unexpected shape for input 'a' for model 'Guarded'. Expected \[-1,1\], got \[1,2\].$",
        ),
        (
            {"a": np.ones(1, np.float32), "b": np.ones(1, np.float32)},
            r"^model 'Guarded' takes batches \(max_batch_size=8\) but inputs 'a' \(shape \(1,\)\), 'b' \(shape \(1,\)\) lack "
            r"the batch axis: add the batch axis \(shape \(1, ...\), e.g. x\[np.newaxis\]\) or bind with ModelConfig\(batching=False\)$",
        ),
        ({"a": np.ones(1, np.float32), "b": ONE}, r"input 'a' \(shape \(1,\)\) lacks the batch axis"),
        (
            {"a": [[1.0]], "b": ONE},
            r"^model 'Guarded': input 'a' is a list: pass a numpy array of dtype float32 and shape \(1, 1\)",
        ),
        ({"a": 1.0, "b": 2}, r"input 'a' is a float: .*; input 'b' is a int: pass a numpy array of dtype float32"),
        ({"a": ONE}, r"^model 'Guarded': missing input \['b'\]; its inputs are \['a', 'b'\]$"),
        ({"a": ONE, "b": ONE, "c": ONE}, r"^model 'Guarded': unexpected input \['c'\]; its inputs are \['a', 'b'\]$"),
        ({"a": np.ones((9, 1), np.float32), "b": np.ones((9, 1), np.float32)}, "batch-size must be <= 8"),
        ({"a": ONE, 3: ONE}, "input names must be strings"),
        ({"a": np.array([[1 + 2j]]), "b": ONE}, "which Triton cannot carry"),
    ],
)
def test_bad_inputs_are_rejected_before_the_callable(counted, inputs, message):
    model, counter = counted
    with pytest.raises(InvalidArgumentError, match=message):
        model.infer(inputs)
    assert counter.batches == 0
    assert model.infer({"a": ONE, "b": ONE})["add"][0, 0] == 2  # still serving


def test_bad_parameters_and_inputs_types(counted):
    model, counter = counted
    with pytest.raises(InvalidArgumentError, match=r"^parameters\['p'\] must be a str, a float, a bool or an int"):
        model.infer({"a": ONE, "b": ONE}, parameters={"p": [1]})
    with pytest.raises(InvalidArgumentError, match="mapping"):
        model.infer([ONE, ONE])
    assert counter.batches == 0


def test_unknown_model(server):
    with pytest.raises(NotFoundError, match="no model 'Nope'"):
        server.model("Nope")
    from embedtriton import Model

    with pytest.raises(TritonError, match="Nope"):
        Model(server, "Nope").infer({"a": ONE})


def test_callable_that_raises_fails_its_batch_only(server, add_sub_tensors, caplog):
    calls = []

    def check(a):
        if (a < 0).any():
            raise ValueError("negative input is not allowed")

    @batch
    def flaky(a, b):
        calls.append(len(a))
        check(a)
        return {"add": a + b, "sub": a - b}

    inputs, outputs = add_sub_tensors
    model = server.bind("Flaky", flaky, inputs, outputs)
    line = check.__code__.co_firstlineno
    try:
        with caplog.at_level("ERROR", logger="embedtriton"):
            for _ in range(3):  # the caller's error says where; the log has the traceback, once
                with pytest.raises(InternalError) as info:
                    model.infer({"a": -ONE, "b": ONE})
                assert str(info.value) == (
                    "model 'Flaky' raised ValueError: negative input is not allowed "
                    f"(at test_errors.py:{line + 2} in check < test_errors.py:{line + 7} in flaky)"
                )
        logged = [r for r in caplog.records if r.levelname == "ERROR" and "Flaky" in r.getMessage()]
        assert len(logged) == 1 and "Traceback" in logged[0].getMessage()  # rate-limited: 1 per 10 s
        assert "check(a)" in logged[0].getMessage()
        assert model.infer({"a": ONE, "b": ONE})["add"][0, 0] == 2
        stats = model.statistics()["inference_stats"]
        assert stats["fail"]["count"] == 3 and stats["success"]["count"] == 1
    finally:
        server.unbind("Flaky")


BAD_OUTPUTS = {
    "missing": (lambda r: {"add": r["a"]}, "returned no output 'sub'"),
    "misnamed": (lambda r: {"add": r["a"], "subtract": r["a"]}, r"returned output 'subtract' .* do not declare"),
    "extra": (
        lambda r: {"add": r["a"], "sub": r["a"], "debug": r["a"]},
        r"returned output 'debug' for request 0, which its outputs do not declare; declare it with a Tensor",
    ),
    "shape": (lambda r: {"add": r["a"], "sub": np.ones((1, 3), np.float32)}, r"output 'sub' with shape \(1, 3\)"),
    "batch": (lambda r: {"add": r["a"], "sub": np.ones((2, 1), np.float32)}, r"output 'sub' with shape \(2, 1\)"),
    "dtype": (
        lambda r: {"add": r["a"], "sub": np.ones((1, 1), np.int64)},
        re.escape(
            "output 'sub' as int64 (INT64) for request 0; its config says FP32 (float32): "
            "return it .astype(np.float32) or declare the output Tensor(dtype=np.int64)"
        ),
    ),
    "not a dict": (lambda r: [r["a"]], "one dict of outputs per request"),
    "not an array": (lambda r: {"add": r["a"], "sub": object()}, "output"),
}


@pytest.mark.parametrize("case", sorted(BAD_OUTPUTS))
def test_bad_outputs_fail_only_the_offending_request(server, case, add_sub_tensors):
    make_bad, message = BAD_OUTPUTS[case]

    def model_func(requests):
        return [
            make_bad(r) if r.parameters.get("bad") else {"add": r["a"] + r["b"], "sub": r["a"] - r["b"]}
            for r in requests
        ]

    inputs, outputs = add_sub_tensors
    model = server.bind("BadOut", model_func, inputs, outputs)
    try:
        with pytest.raises(InternalError, match=message):
            model.infer({"a": ONE, "b": ONE}, parameters={"bad": True})
        assert model.infer({"a": ONE, "b": ONE})["add"][0, 0] == 2
    finally:
        server.unbind("BadOut")


def test_callable_returning_wrong_count(server, add_sub_tensors):
    inputs, outputs = add_sub_tensors
    model = server.bind("WrongCount", lambda requests: [], inputs, outputs)
    try:
        with pytest.raises(InternalError, match="one dict per request"):
            model.infer({"a": ONE, "b": ONE})
    finally:
        server.unbind("WrongCount")


def test_functions_of_arrays_without_batch_get_a_fix_it(server, add_sub_tensors):
    inputs, outputs = add_sub_tensors

    def add_sub(a, b):
        return {"add": a + b, "sub": a - b}

    with pytest.raises(
        InvalidArgumentError, match=r"model 'Plain': infer_func\(a, b\) .* decorate it with @embedtriton.batch"
    ):
        server.bind("Plain", add_sub, inputs, outputs)
    model = server.bind("ListBack", batch(lambda a, b: [a + b, a - b]), inputs, outputs)
    try:
        with pytest.raises(InternalError, match="a @batch function must return a dict of arrays .*, not list"):
            model.infer({"a": ONE, "b": ONE})
    finally:
        server.unbind("ListBack")


def test_config_validation_messages(add_sub, add_sub_tensors):
    with pytest.raises(InvalidArgumentError, match="max_batch_size must be >= 1"):
        ModelConfig(max_batch_size=0)
    ModelConfig(batching=False, max_batch_size=0)  # fine without batching
    with pytest.raises(InvalidArgumentError, match="dtype"):
        Tensor(name="x", dtype=np.complex64, shape=(1,))
    with pytest.raises(InvalidArgumentError, match="positive or -1"):
        Tensor(name="x", dtype=np.float32, shape=(0,))
    with pytest.raises(InvalidArgumentError, match="unique"):
        Server().bind("Dup", add_sub, [Tensor(name="a", dtype=np.float32, shape=(1,))] * 2, add_sub_tensors[1])
    with pytest.raises(InvalidArgumentError, match="input x has labels; class labels belong to outputs"):
        Server().bind("In", add_sub, [Tensor(name="x", dtype=np.float32, shape=(1,), labels=["a"])], add_sub_tensors[1])
    for name in ("x" * 256, "\u00e9" * 128, "a\0b"):  # a folder name: at most 255 bytes, no NUL
        with pytest.raises(InvalidArgumentError, match="model_name must be at most 255 bytes"):
            Server().bind(name, add_sub, *add_sub_tensors)
    with pytest.raises(InvalidArgumentError, match="cache_config"):
        Server.__init__(Server.__new__(Server), __import__("embedtriton").ServerConfig(cache_config=["local,size"]))


def test_bind_twice_and_unbind_unknown(server, add_sub, add_sub_tensors):
    inputs, outputs = add_sub_tensors
    with pytest.raises(InvalidArgumentError, match="already bound"):
        server.bind("AddSub", add_sub, inputs, outputs)
    with pytest.raises(NotFoundError):
        server.unbind("NotBound")


def test_calls_on_a_stopped_server(add_sub, add_sub_tensors):
    srv = Server()
    inputs, outputs = add_sub_tensors
    srv.bind("AddSub", add_sub, inputs, outputs)
    with pytest.raises(UnavailableError, match="not running"):
        srv.model("AddSub").infer({"a": ONE, "b": ONE})
    with pytest.raises(UnavailableError, match="not running"):
        srv.metrics()


def test_missing_runtime_names_both_ways(monkeypatch, tmp_path):
    monkeypatch.setenv(HOME_VARIABLE, str(tmp_path))
    with pytest.raises(NotFoundError, match="lib/libtritonserver.so"):
        find_runtime()
    import embedtriton.triton.runtime as runtime

    monkeypatch.delenv(HOME_VARIABLE)
    monkeypatch.setattr(runtime, "_from_pytriton_wheel", lambda: None)
    with pytest.raises(NotFoundError) as info:
        find_runtime()
    assert "pip install --no-deps nvidia-pytriton==0.7.0" in str(info.value)
    assert HOME_VARIABLE in str(info.value)


def test_load_failure_carries_tritons_reason(add_sub, add_sub_tensors):
    """A configuration that gets past our validation but not Triton's (here forced past ours):
    the error carries the reason Triton logged, and the other models keep serving."""
    from embedtriton import DynamicBatcher

    config = ModelConfig(batcher=DynamicBatcher(preferred_batch_size=[4]))
    object.__setattr__(config.batcher, "preferred_batch_size", [16])  # over max_batch_size 4
    srv = Server()
    inputs, outputs = add_sub_tensors
    with srv:
        srv.bind("Ok", add_sub, inputs, outputs)
        with pytest.raises(TritonError, match="failed to load 'Bad'.*preferred size must be <= max batch size"):
            srv.bind("Bad", add_sub, inputs, outputs, config)
        assert srv.model("Ok").ready
        assert "Bad" not in [m.name for m in srv.models()]


def test_response_cache_needs_a_configured_cache(server, add_sub, add_sub_tensors):
    inputs, outputs = add_sub_tensors
    with pytest.raises(InvalidArgumentError, match="input x has labels; class labels belong to outputs"):
        Server().bind("In", add_sub, [Tensor(name="x", dtype=np.float32, shape=(1,), labels=["a"])], add_sub_tensors[1])
    for name in ("x" * 256, "\u00e9" * 128, "a\0b"):  # a folder name: at most 255 bytes, no NUL
        with pytest.raises(InvalidArgumentError, match="model_name must be at most 255 bytes"):
            Server().bind(name, add_sub, *add_sub_tensors)
    with pytest.raises(InvalidArgumentError, match="cache_config"):
        server.bind("Cached", add_sub, inputs, outputs, ModelConfig(response_cache=True))


def test_non_contiguous_numpy_inputs_are_copied_once(counted):
    """As README says: a strided numpy view reaches Triton as a contiguous copy."""
    model, _ = counted
    wide = np.arange(8, dtype=np.float32).reshape(4, 2)
    out = model.infer({"a": wide[:, :1], "b": np.ascontiguousarray(wide[:, 1:])})  # a is a strided view
    np.testing.assert_array_equal(out["add"][:, 0], wide[:, 0] + wide[:, 1])


def test_a_callable_failing_its_warm_up_fails_the_load_not_the_process(add_sub, add_sub_tensors):
    """Triton 2.51 crashes (TritonModelInstance teardown) when a warm-up request fails: the
    backend records the failure instead and the server fails the load with its reason."""
    from embedtriton import InstanceGroup, ModelWarmup, WarmupInput

    @batch
    def refuses_zeros(a, b):
        if not a.any():
            raise ValueError("all-zero input")
        return {"add": a + b, "sub": a - b}

    zeros = {n: WarmupInput(dtype=np.float32, shape=(1,), zero_data=True) for n in "ab"}
    ones = {n: WarmupInput(dtype=np.float32, shape=(1,), random_data=True) for n in "ab"}
    inputs, outputs = add_sub_tensors
    srv = Server()
    with srv:
        for groups in (None, [InstanceGroup(count=2)]):
            warm = ModelConfig(
                model_warmup=[ModelWarmup(name="zeros", batch_size=2, inputs=zeros, count=2)], instance_group=groups
            )
            with pytest.raises(
                InternalError,
                match=r"failed to load 'Cold': its warm-up failed: model 'Cold' raised ValueError: all-zero input",
            ):
                srv.bind("Cold", refuses_zeros, inputs, outputs, warm)
            assert "Cold" not in [m.name for m in srv.models()]
        good = ModelConfig(model_warmup=[ModelWarmup(name="random", batch_size=1, inputs=ones, count=3)])
        model = srv.bind("Warm", refuses_zeros, inputs, outputs, good)  # warm-ups pass: errors count again
        with pytest.raises(InternalError, match="all-zero input"):
            model.infer({"a": np.zeros((1, 1), np.float32), "b": ONE})
        assert model.infer({"a": ONE, "b": ONE})["add"][0, 0] == 2
        bad = ModelConfig(model_warmup=[ModelWarmup(name="zeros", batch_size=1, inputs=zeros)])
        with pytest.raises(InternalError, match="its warm-up failed"):
            srv.load("Warm", config=bad)  # a reload whose warm-up fails: the previous config serves again
        assert srv.binding("Warm").config == good
        assert model.infer({"a": ONE, "b": ONE})["add"][0, 0] == 2
