"""Stateful models: Triton's sequence batcher with a per-sequence state the library keeps."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from helpers import wait_for

from embedtriton import (
    InstanceGroup,
    InvalidArgumentError,
    ModelConfig,
    SequenceBatcher,
    Server,
    Tensor,
    UnavailableError,
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
        assert binding.runner._states == {}  # every sequence ended: its state was dropped
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
        time.sleep(0.6)  # idle 3 times idle_us, the condition under test (Triton does not tell the model it ends one)
        with pytest.raises(InvalidArgumentError, match="START"):
            model.infer(one(1), correlation_id=1)  # Triton ended the idle sequence
        assert model.infer(one(5), correlation_id=2, sequence_start=True)["total"][0, 0] == 5
        assert 1 not in server._bound["Acc"].runner._states  # and its state is gone
        assert model.infer(one(1), correlation_id=1, sequence_start=True)["total"][0, 0] == 1  # a fresh start


def test_sequence_batcher_validation():
    with pytest.raises(InvalidArgumentError, match="strategy"):
        SequenceBatcher(strategy="newest")
    with pytest.raises(InvalidArgumentError, match="apply to strategy='oldest'"):
        SequenceBatcher(max_candidate_sequences=4)


def iterative_server(step_seconds=0.0, closed=None, idle_us=1_000_000, slow_step=None):
    def tokens(request):
        """An iterative model's function takes one request and yields its outputs step by step."""
        try:
            for i in range(int(request["n"][0, 0])):
                time.sleep(step_seconds if i != slow_step else 1.0)
                yield {"token": np.array([[i]], np.int32)}
        finally:
            if closed is not None:
                closed.append(int(request["n"][0, 0]))

    server = Server()
    server.bind(
        "Tokens",
        tokens,
        [Tensor(name="n", dtype=np.int32, shape=(1,))],
        [Tensor(name="token", dtype=np.int32, shape=(1,))],
        ModelConfig(
            max_batch_size=4,
            decoupled=True,
            sequence_batcher=SequenceBatcher(iterative=True, max_sequence_idle_microseconds=idle_us),
        ),
    )
    return server


def ask(model, n):
    return [int(p["token"][0, 0]) for p in model.stream({"n": np.array([[n]], np.int32)})]


def test_iterative_sequences_stream_each_step_and_let_new_requests_join():
    server = iterative_server(step_seconds=0.002)
    lengths = [3, 8, 1, 6, 2, 9, 4, 7]
    results = {}
    with server:
        model = server.model("Tokens")
        assert ask(model, 5) == [0, 1, 2, 3, 4]
        threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, ask(model, n))) for n in lengths]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        stats = model.statistics()
        assert server._bound["Tokens"].runner._gens == {}  # every finished request freed its slot
    assert results == {n: list(range(n)) for n in lengths}
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 1  # requests shared iterations
    # one iteration per token (+1 to see each generator end): far fewer than one batch per request-token
    assert stats["execution_count"] < sum(lengths) + 5 + len(lengths) + 1


def test_leaving_an_iterative_stream_closes_its_generator():
    closed: list[int] = []
    server = iterative_server(step_seconds=0.005, closed=closed)
    with server:
        model = server.model("Tokens")
        got = []
        for part in model.stream({"n": np.array([[1000]], np.int32)}):
            got.append(part)
            if len(got) == 3:
                break
        assert wait_for(lambda: closed), "the generator was not closed after the consumer left"
        assert closed == [1000]
        assert ask(model, 2) == [0, 1]


def test_an_iteration_longer_than_the_idle_limit_fails_its_sequence_instead_of_losing_it():
    """An iteration counts against max_sequence_idle_microseconds (the request is in no queue while
    it runs): Triton's reaper ends the sequence and refuses its RESCHEDULE, leaving the request
    with the backend. Its caller gets what was sent and then an error saying what to change; it
    used to wait forever (CI: an OpenAI step model's first prefill took over 1 s under load)."""
    server = iterative_server(idle_us=200_000, slow_step=1)  # (reaped within 0.4 s of the slow step)
    got: list = []
    failed: list = []

    def consume():
        try:
            for part in server.model("Tokens").stream({"n": np.array([[4]], np.int32)}):
                got.append(int(part["token"][0, 0]))
        except Exception as exc:
            failed.append(exc)

    with server:
        reader = threading.Thread(target=consume)
        reader.start()
        reader.join(timeout=20)
        assert not reader.is_alive(), "the stream was left hanging"
        assert ask(server.model("Tokens"), 1) == [0]  # (and the model goes on serving)
    assert got == [0, 1]
    assert len(failed) == 1 and isinstance(failed[0], UnavailableError), failed
    assert "max_sequence_idle_microseconds" in str(failed[0])


def test_iterative_needs_decoupled():
    with pytest.raises(InvalidArgumentError, match="decoupled=True"):
        ModelConfig(sequence_batcher=SequenceBatcher(iterative=True))


def test_iterative_batch_step_form_keeps_slots_full():
    from embedtriton import Final

    calls: list[list[int]] = []

    def step(requests):
        """Batch-step form: every in-flight request, once per iteration, with its own state."""
        calls.append([int(r["n"][0, 0]) for r in requests])
        out = []
        for r in requests:
            made = r.state.setdefault("made", 0)
            r.state["made"] = made + 1
            token = {"token": np.array([[made]], np.int32)}
            n = int(r["n"][0, 0])
            out.append(token if made + 1 < n else Final(token if n else None))
        time.sleep(0.002)
        return out

    server = Server()
    server.bind(
        "Steps",
        step,
        [Tensor(name="n", dtype=np.int32, shape=(1,))],
        [Tensor(name="token", dtype=np.int32, shape=(1,))],
        ModelConfig(max_batch_size=4, decoupled=True, sequence_batcher=SequenceBatcher(iterative=True)),
    )
    lengths = [6, 1, 3, 9, 2, 5, 4]
    results = {}
    with server:
        model = server.model("Steps")
        threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, ask(model, n))) for n in lengths]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert server._bound["Steps"].runner._live == {}
    assert results == {n: list(range(n)) for n in lengths}
    assert sum(len(c) for c in calls) == sum(lengths)  # one step per token, none wasted
    assert len(calls) < sum(lengths)  # and requests shared iterations
