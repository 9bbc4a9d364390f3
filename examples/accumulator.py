"""A stateful model on Triton's sequence batcher: a running sum per sequence.

Many sequences (correlation ids) are interleaved by concurrent callers; Triton routes every
request of a sequence to the same model instance, in order, and the library hands the
callable the sequence's own `state` dict.

    python examples/accumulator.py
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from embedtriton import InstanceGroup, ModelConfig, SequenceBatcher, Server, Tensor


def running_sum(requests):
    outputs = []
    for request in requests:
        state = request.state  # created at the sequence's start, dropped at its end
        state["total"] = state.get("total", 0) + int(request["value"][0, 0])
        outputs.append({"total": np.array([[state["total"]]], np.int64)})
    return outputs


def main() -> None:
    server = Server()
    server.bind(
        "Accumulator",
        running_sum,
        inputs=[Tensor(name="value", dtype=np.int64, shape=(1,))],
        outputs=[Tensor(name="total", dtype=np.int64, shape=(1,))],
        config=ModelConfig(
            max_batch_size=8,
            sequence_batcher=SequenceBatcher(strategy="direct", max_sequence_idle_microseconds=5_000_000),
            instance_group=[InstanceGroup(count=2)],
        ),
    )
    with server:
        model = server.model("Accumulator")

        def customer(cid: int) -> list[int]:
            totals = []
            for step in range(5):
                out = model.infer(
                    {"value": np.array([[cid]], np.int64)},
                    correlation_id=cid,
                    sequence_start=step == 0,
                    sequence_end=step == 4,
                )
                totals.append(int(out["total"][0, 0]))
            return totals

        with ThreadPoolExecutor(16) as pool:
            results = dict(zip(range(1, 17), pool.map(customer, range(1, 17)), strict=True))
        for cid in (1, 2, 16):
            print(f"sequence {cid}: running totals {results[cid]}")
        assert all(results[c] == [c * k for k in range(1, 6)] for c in results)
        print(f"16 interleaved sequences, every running total correct; executions: "
              f"{model.statistics()['execution_count']} for 80 requests")  # fmt: skip


if __name__ == "__main__":
    main()
