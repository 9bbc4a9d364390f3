"""AddSub, the model from PyTriton's binding docs, served in-process by embedtriton.

Binds a @batch function, calls it directly (sync, then 64 concurrent callers so Triton's
dynamic batcher groups them), and prints the results and the batch statistics.

    python examples/add_sub.py
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from embedtriton import DynamicBatcher, ModelConfig, Server, Tensor, batch


@batch
def add_sub(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    return {"add": a + b, "sub": a - b}


def main() -> None:
    started = time.perf_counter()
    server = Server()
    server.bind(
        model_name="AddSub",
        infer_func=add_sub,
        inputs=[Tensor(name="a", dtype=np.float32, shape=(1,)), Tensor(name="b", dtype=np.float32, shape=(1,))],
        outputs=[Tensor(name="add", dtype=np.float32, shape=(1,)), Tensor(name="sub", dtype=np.float32, shape=(1,))],
        config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(max_queue_delay_microseconds=1000)),
    )
    with server:
        print(f"Triton {server.metadata()['version']} started in-process in {time.perf_counter() - started:.2f} s")
        model = server.model("AddSub")

        a = np.array([[1.0], [2.0]], np.float32)
        b = np.array([[10.0], [20.0]], np.float32)
        out = model.infer({"a": a, "b": b})
        print(f"a = {a.ravel()}, b = {b.ravel()}")
        print(f"add = {out['add'].ravel()}, sub = {out['sub'].ravel()}")

        def one(i: int) -> float:
            x = np.full((1, 1), i, np.float32)
            return float(model.infer({"a": x, "b": x})["add"][0, 0])

        with ThreadPoolExecutor(64) as pool:
            sums = list(pool.map(one, range(64)))
        assert sums == [2.0 * i for i in range(64)]
        print("64 concurrent single-row requests: all answers correct")

        stats = model.statistics()
        requests = stats["inference_stats"]["success"]["count"]  # (inference_count counts rows)
        print(f"requests: {requests} ({stats['inference_count']} rows), model executions: {stats['execution_count']}")
        for entry in sorted(stats["batch_stats"], key=lambda e: e["batch_size"]):
            print(f"  batch size {entry['batch_size']}: {entry['compute_infer']['count']} executions")


if __name__ == "__main__":
    main()
