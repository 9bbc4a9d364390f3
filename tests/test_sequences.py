"""Stateful models: Triton's sequence batcher with a per-sequence state the library keeps."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from embedtriton import (
    InstanceGroup,
    InvalidArgumentError,
    ModelConfig,
    SequenceBatcher,
    Server,
    Tensor,
)

X = [Tensor(name="x", dtype=np.float32, shape=(1,))]
TOTAL = [Tensor(name="total", dtype=np.float32, shape=(1,))]


def one(value: float) -> dict[str, np.ndarray]:
    return {"x": np.full((1, 1), value, np.float32)}


class Accumulator:
    """A running sum per sequence, recording what the callable saw."""

    def __init__(self):
        self.seen = []  # (correlation_id, start, end, id(state), thread)
        self.lock = threading.Lock()

    def __call__(self, requests):
        out = []
        for r in requests:
            with self.lock:
                self.seen.append(
                    (r.correlation_id, r.sequence_start, r.sequence_end, id(r.state), threading.get_ident())
                )
            r.state["total"] = r.state.get("total", 0.0) + float(r["x"][0, 0])
            out.append({"total": np.array([[r.state["total"]]], np.float32)})
        return out


def serve(strategy="direct", idle_us=1_000_000, instances=2):
    acc = Accumulator()
    server = Server()
    server.bind(
        "Acc",
        acc,
        X,
        TOTAL,
        ModelConfig(
            max_batch_size=4,
            sequence_batcher=SequenceBatcher(strategy=strategy, max_sequence_idle_microseconds=idle_us),
            instance_group=[InstanceGroup(count=instances)],
        ),
    )
    return server, acc


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
def test_interleaved_sequences_from_concurrent_callers(strategy):
    server, acc = serve(strategy)
    totals: dict[object, list[float]] = {}

    def sequence(cid, values):
        model = server.model("Acc")
        got = []
        for i, v in enumerate(values):
            out = model.infer(one(v), correlation_id=cid, sequence_start=i == 0, sequence_end=i == len(values) - 1)
            got.append(float(out["total"][0, 0]))
        totals[cid] = got

    ids = list(range(1, 9)) + [f"user-{k}" for k in range(4)]
    with server:
        threads = [threading.Thread(target=sequence, args=(cid, [k + 1.0] * 5)) for k, cid in enumerate(ids)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        binding = server._bound["Acc"]
        assert binding._states == {}  # every sequence ended: its state was dropped
    for k, cid in enumerate(ids):
        step = k + 1.0
        assert totals[cid] == [step * (i + 1) for i in range(5)], (cid, totals[cid])
    by_id: dict[object, list] = {}
    for cid, start, end, state, thread in acc.seen:
        by_id.setdefault(cid, []).append((start, end, state, thread))
    for rows in by_id.values():
        assert [r[0] for r in rows] == [True, False, False, False, False]  # in order
        assert [r[1] for r in rows] == [False, False, False, False, True]
        assert len({r[2] for r in rows}) == 1  # one state object per sequence
        assert len({r[3] for r in rows}) == 1  # one instance (thread) per sequence
    assert len({rows[0][3] for rows in by_id.values()}) == 2  # both instances served sequences


def test_sequence_errors():
    server, _ = serve()
    with server:
        model = server.model("Acc")
        with pytest.raises(InvalidArgumentError, match="must specify the START flag"):
            model.infer(one(1), correlation_id=12345)
        with pytest.raises(InvalidArgumentError, match="correlation ID"):
            model.infer(one(1))
        with pytest.raises(InvalidArgumentError, match="need a correlation_id"):
            model.infer(one(1), sequence_start=True)
        with pytest.raises(InvalidArgumentError, match="correlation_id must be"):
            model.infer(one(1), correlation_id=-3, sequence_start=True)
        assert model.infer(one(2), correlation_id=5, sequence_start=True, sequence_end=True)["total"][0, 0] == 2


def test_idle_sequences_time_out_and_lose_their_state():
    server, _ = serve(idle_us=200_000, instances=1)
    with server:
        model = server.model("Acc")
        assert model.infer(one(1), correlation_id=1, sequence_start=True)["total"][0, 0] == 1
        assert model.infer(one(1), correlation_id=1)["total"][0, 0] == 2
        time.sleep(0.6)
        with pytest.raises(InvalidArgumentError, match="START"):
            model.infer(one(1), correlation_id=1)  # Triton ended the idle sequence
        assert model.infer(one(5), correlation_id=2, sequence_start=True)["total"][0, 0] == 5
        assert 1 not in server._bound["Acc"]._states  # and its state is gone
        assert model.infer(one(1), correlation_id=1, sequence_start=True)["total"][0, 0] == 1  # a fresh start


def test_sequence_batcher_validation():
    with pytest.raises(InvalidArgumentError, match="strategy"):
        SequenceBatcher(strategy="newest")
    with pytest.raises(InvalidArgumentError, match="apply to strategy='oldest'"):
        SequenceBatcher(max_candidate_sequences=4)
