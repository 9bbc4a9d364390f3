"""Triton's scheduling features on a bound function: priorities, queue limits and timeouts,
instance groups, and per-request parameters.

    python examples/scheduling.py
"""

from __future__ import annotations

import threading
import time

import numpy as np

from embedtriton import (
    DynamicBatcher,
    InstanceGroup,
    ModelConfig,
    QueuePolicy,
    Server,
    Tensor,
    TimeoutAction,
    TritonError,
    batch,
)

X = [Tensor(name="x", dtype=np.float32, shape=(1,))]
Y = [Tensor(name="y", dtype=np.float32, shape=(1,))]
order: list[str] = []


def job(requests):
    """Each request sleeps for its 'seconds' parameter and records its 'name'."""
    for r in requests:
        time.sleep(r.parameters.get("seconds", 0.0))
        order.append(r.parameters["name"])
    return [{"y": r["x"]} for r in requests]


@batch
def scaled(x, parameters):
    """@batch functions may take the requests' parameters: one dict per request."""
    factors = np.concatenate([np.full((1, 1), p.get("factor", 1.0), np.float32) for p in parameters])
    return {"y": x * factors}


def call_in_background(model, name, priority=None, seconds=0.0, timeout_us=None):
    def run():
        try:
            model.infer(
                {"x": np.ones((1, 1), np.float32)},
                parameters={"name": name, "seconds": seconds},
                priority=priority,
                timeout_us=timeout_us,
            )
        except TritonError as exc:
            order.append(f"{name}: {type(exc).__name__}: {exc}")

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.02)  # keep the arrival order
    return thread


def main() -> None:
    server = Server()
    one_at_a_time = dict(max_batch_size=1)
    server.bind(
        "Priorities",
        job,
        X,
        Y,
        ModelConfig(**one_at_a_time, batcher=DynamicBatcher(priority_levels=2, default_priority_level=2)),
    )
    server.bind(
        "Bounded",
        job,
        X,
        Y,
        ModelConfig(
            **one_at_a_time,
            batcher=DynamicBatcher(
                default_queue_policy=QueuePolicy(
                    max_queue_size=2,
                    timeout_action=TimeoutAction.REJECT,
                    default_timeout_microseconds=1_000_000,
                    allow_timeout_override=True,
                )
            ),
        ),
    )
    server.bind("TwoInstances", job, X, Y, ModelConfig(**one_at_a_time, instance_group=[InstanceGroup(count=2)]))
    server.bind("Scaled", scaled, X, Y)
    with server:
        print("1. priority 1 overtakes a queued backlog of priority 2:")
        threads = [call_in_background(server.model("Priorities"), "busy", seconds=0.3)]
        threads += [call_in_background(server.model("Priorities"), f"low-{i}") for i in range(3)]
        threads += [call_in_background(server.model("Priorities"), "URGENT", priority=1)]
        for t in threads:
            t.join()
        print("   executed:", ", ".join(order))

        order.clear()
        print("2. a queue of at most 2, and a request whose own 50 ms timeout expires:")
        threads = [call_in_background(server.model("Bounded"), "busy", seconds=0.3)]
        threads += [call_in_background(server.model("Bounded"), "patient")]
        threads += [call_in_background(server.model("Bounded"), "hasty", timeout_us=50_000)]
        threads += [call_in_background(server.model("Bounded"), "one too many")]
        for t in threads:
            t.join()
        for line in order:
            print("  ", line)

        order.clear()
        print("3. two instances run two 0.3 s requests side by side:")
        started = time.monotonic()
        threads = [call_in_background(server.model("TwoInstances"), f"r{i}", seconds=0.3) for i in range(2)]
        for t in threads:
            t.join()
        print(f"   both done in {time.monotonic() - started:.2f} s: {', '.join(order[-2:])}")

        out = server.model("Scaled").infer({"x": np.full((1, 1), 2.0, np.float32)}, parameters={"factor": 10.0})
        print(f"4. parameters reach @batch functions: 2 * factor 10 = {out['y'][0, 0]}")


if __name__ == "__main__":
    main()
