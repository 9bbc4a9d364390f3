"""Custom batching rules: a Python predicate decides which pending requests join a batch."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from embedtriton import DynamicBatcher, InvalidArgumentError, ModelConfig, SequenceBatcher, Server, Tensor

X = [Tensor(name="x", dtype=np.float32, shape=(1,))]
Y = [Tensor(name="y", dtype=np.float32, shape=(1,))]


def serve(rule, batches):
    def model(requests):
        batches.append([dict(r.parameters) for r in requests])
        return [{"y": r["x"] * 2} for r in requests]

    server = Server()
    server.bind(
        "Ruled",
        model,
        X,
        Y,
        ModelConfig(max_batch_size=16, batcher=DynamicBatcher(max_queue_delay_microseconds=20_000), batch_rule=rule),
    )
    return server


def send_concurrently(server, parameter_sets):
    results = [None] * len(parameter_sets)

    def call(i, params):
        results[i] = server.model("Ruled").infer({"x": np.full((1, 1), i, np.float32)}, parameters=params)

    threads = [threading.Thread(target=call, args=(i, p)) for i, p in enumerate(parameter_sets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for i, out in enumerate(results):
        assert out is not None and out["y"][0, 0] == 2 * i  # every answer routed to its caller
    return results


def test_a_rule_caps_the_total_of_a_parameter():
    def at_most_ten_tokens(candidate, batch):
        return sum(r.parameters["tokens"] for r in batch) + candidate.parameters["tokens"] <= 10

    batches: list = []
    server = serve(at_most_ten_tokens, batches)
    tokens = [int(t) for t in np.random.default_rng(1).integers(1, 7, 48)]
    with server:
        send_concurrently(server, [{"tokens": t} for t in tokens])
    assert sum(len(b) for b in batches) == 48
    assert max(sum(p["tokens"] for p in b) for b in batches) <= 10
    assert max(len(b) for b in batches) > 1  # requests were still batched


def test_a_rule_groups_requests_that_share_a_parameter():
    def same_adapter(candidate, batch):
        return not batch or batch[0].parameters["adapter"] == candidate.parameters["adapter"]

    batches: list = []
    server = serve(same_adapter, batches)
    with server:
        send_concurrently(server, [{"adapter": "ab"[i // 20]} for i in range(40)])  # two runs of arrivals
    assert all(len({p["adapter"] for p in b}) == 1 for b in batches)
    assert max(len(b) for b in batches) > 1


def test_a_rule_that_raises_lets_requests_in(caplog):
    def broken(candidate, batch):
        raise KeyError("no such parameter")

    batches: list = []
    server = serve(broken, batches)
    with server:
        send_concurrently(server, [{} for _ in range(8)])
    assert sum(len(b) for b in batches) == 8
    assert "batch_rule of model 'Ruled' raised" in caplog.text


def test_batch_rule_validation():
    with pytest.raises(InvalidArgumentError, match="callable"):
        ModelConfig(batch_rule=3)
    with pytest.raises(InvalidArgumentError, match="needs batching=True"):
        ModelConfig(batching=False, batch_rule=lambda c, b: True)
    with pytest.raises(InvalidArgumentError, match="no sequence_batcher"):
        ModelConfig(batch_rule=lambda c, b: True, sequence_batcher=SequenceBatcher())
