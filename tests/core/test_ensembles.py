"""Ensembles through the real runtime: a DAG of bound callables that Triton's ensemble
scheduler runs as one model, everywhere a model works."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from embedtriton import (
    InvalidArgumentError,
    ModelConfig,
    SequenceBatcher,
    Server,
    Step,
    Tensor,
    UnavailableError,
    batch,
)

F32 = np.float32


def t(name: str, shape=(1,), dtype=F32) -> Tensor:
    return Tensor(name=name, dtype=dtype, shape=shape)


@batch
def double(x):
    return {"y": x * 2}


@batch
def add_one(y):
    return {"z": y + 1}


@batch
def mix(a, b):
    return {"out": a * 10 + b}


def flat(requests):  # batching=False: one request at a time, full shapes
    return [{"w": -r["v"]} for r in requests]


def repeat(requests):  # decoupled: three responses per request
    for i in range(3):
        yield [{"part": r["y"] + i} for r in requests]


def running_sum(requests):  # a sequence model: state per correlation id
    out = []
    for r in requests:
        r.state["total"] = r.state.get("total", 0) + float(r["y"].sum())  # a dict per sequence
        out.append({"total": np.full((1, 1), r.state["total"], F32)})
    return out


@pytest.fixture(scope="module")
def server():
    server = Server()
    batched = ModelConfig(max_batch_size=8)
    server.bind("Double", double, [t("x")], [t("y")], batched)
    server.bind("AddOne", add_one, [t("y")], [t("z")], batched)
    server.bind("Mix", mix, [t("a"), t("b")], [t("out")], ModelConfig(max_batch_size=16))
    server.bind("Flat", flat, [t("v", (-1, 1))], [t("w", (-1, 1))], ModelConfig(batching=False))
    server.bind("Repeat", repeat, [t("y")], [t("part")], ModelConfig(max_batch_size=8, decoupled=True))
    server.bind(
        "Sum", running_sum, [t("y")], [t("total")], ModelConfig(max_batch_size=1, sequence_batcher=SequenceBatcher())
    )
    # bound before start: loaded at start, after the models it uses
    server.bind_ensemble(
        "Chain",
        [Step("Double", {"x": "IN"}, {"y": "doubled"}), Step("AddOne", {"y": "doubled"}, {"z": "OUT"})],
        [t("IN")],
        [t("OUT")],
        ModelConfig(max_batch_size=8),
    )
    with server:
        yield server


def test_a_chain_in_one_call_with_statistics_per_ensemble_and_step(server):
    before = server.model("Double").statistics()["inference_count"]
    x = np.arange(4, dtype=F32).reshape(4, 1)
    out = server.model("Chain").infer({"IN": x})
    np.testing.assert_array_equal(out["OUT"], x * 2 + 1)
    assert server.model("Chain").statistics()["inference_count"] >= 4
    assert server.model("Double").statistics()["inference_count"] == before + 4

    async def many():
        return await asyncio.gather(*(server.model("Chain").infer_async({"IN": x[i : i + 1]}) for i in range(4)))

    results = asyncio.run(many())
    assert [r["OUT"][0, 0] for r in results] == [1, 3, 5, 7]


def test_a_dag_with_fan_out_fan_in_and_a_model_without_batching(server):
    model = server.bind_ensemble(
        "Dag",
        [
            Step("Double", {"x": "IN"}, {"y": "d"}),  # d fans out to AddOne and Mix
            Step("AddOne", {"y": "d"}, {"z": "e"}),
            Step("Mix", {"a": "d", "b": "e"}, {"out": "m"}),  # fan-in
            Step("Flat", {"v": "m"}, {"w": "OUT"}),  # batching=False: takes [-1, 1] whole
        ],
        [t("IN")],
        [t("OUT"), t("m")],
        ModelConfig(max_batch_size=8),
    )
    try:
        out = model.infer({"IN": np.array([[1.0], [2.0]], F32)})
        np.testing.assert_array_equal(out["m"], [[23.0], [45.0]])  # d*10 + (d+1)
        np.testing.assert_array_equal(out["OUT"], [[-23.0], [-45.0]])
    finally:
        server.unbind("Dag")


def test_a_decoupled_step_streams_through_a_decoupled_ensemble(server):
    steps = [Step("Double", {"x": "IN"}, {"y": "d"}), Step("Repeat", {"y": "d"}, {"part": "OUT"})]
    with pytest.raises(InvalidArgumentError, match=r"step model \['Repeat'\] is decoupled"):
        server.bind_ensemble("Lossy", steps, [t("IN")], [t("OUT")], ModelConfig(max_batch_size=8))
    model = server.bind_ensemble(
        "Streaming", steps, [t("IN")], [t("OUT")], ModelConfig(max_batch_size=8, decoupled=True)
    )
    try:
        parts = [p["OUT"][0, 0] for p in model.stream({"IN": np.ones((1, 1), F32)})]
        assert parts == [2.0, 3.0, 4.0]
    finally:
        server.unbind("Streaming")


def test_a_sequence_model_as_a_step_keeps_its_state_per_correlation_id(server):
    steps = [Step("Double", {"x": "IN"}, {"y": "d"}), Step("Sum", {"y": "d"}, {"total": "OUT"})]
    model = server.bind_ensemble("Totals", steps, [t("IN")], [t("OUT")], ModelConfig(max_batch_size=1))
    try:
        one = np.ones((1, 1), F32)
        totals = [
            model.infer({"IN": one * v}, correlation_id=7, sequence_start=i == 0, sequence_end=i == 2)["OUT"][0, 0]
            for i, v in enumerate([1, 2, 3])
        ]
        assert totals == [2.0, 6.0, 12.0]
    finally:
        server.unbind("Totals")


def test_step_models_cannot_go_while_an_ensemble_uses_them(server):
    with pytest.raises(InvalidArgumentError, match=r"model 'AddOne' is a step of ensemble \['Chain'\]: unbind the"):
        server.unbind("AddOne")
    server.unload("AddOne")  # kept bound: the ensemble is unavailable and says which step is down
    try:
        with pytest.raises(UnavailableError, match=r"ensemble 'Chain' is unavailable: its step model \['AddOne'\]"):
            server.model("Chain").infer({"IN": np.ones((1, 1), F32)})
        assert not server.model("Chain").ready
    finally:
        server.load("AddOne")
    assert server.model("Chain").ready
    assert server.model("Chain").infer({"IN": np.ones((1, 1), F32)})["OUT"][0, 0] == 3.0


def test_unbinding_an_ensemble_frees_its_steps(server):
    server.bind("Temp", double, [t("x")], [t("y")], ModelConfig(max_batch_size=8))
    server.bind_ensemble("UsesTemp", [Step("Temp", {"x": "IN"}, {"y": "OUT"})], [t("IN")], [t("OUT")])
    with pytest.raises(InvalidArgumentError, match="is already bound"):
        server.bind_ensemble("UsesTemp", [Step("Temp", {"x": "IN"}, {"y": "OUT"})], [t("IN")], [t("OUT")])
    server.unbind("UsesTemp")
    server.unbind("Temp")
    assert {m.name for m in server.models()} >= {"Chain", "Double"}
