"""Hot swap: bind version 2 of a model while 64 callers keep calling it.

Triton loads version 2, moves traffic to it once it is ready (the default VersionPolicy serves
the latest version), lets the requests already on version 1 finish there and then unloads
version 1. Prints the answers per version in each tenth of a second, and the errors (none).

    python examples/hot_swap.py
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np

from embedtriton import ModelConfig, Server, Tensor, batch

X = [Tensor(name="x", dtype=np.float32, shape=(1,))]
VERSION = [Tensor(name="version", dtype=np.int32, shape=(1,))]


def model_version(number: int):
    @batch
    def answer(x: np.ndarray) -> dict[str, np.ndarray]:
        time.sleep(0.0005)  # some work
        return {"version": np.full(x.shape, number, np.int32)}

    return answer


def main() -> None:
    server = Server()
    server.bind("Model", model_version(1), X, VERSION, ModelConfig(max_batch_size=32))
    windows: list[Counter[int]] = [Counter()]
    errors: list[BaseException] = []
    stop = threading.Event()
    lock = threading.Lock()

    def caller() -> None:
        model = server.model("Model")
        x = np.ones((1, 1), np.float32)
        while not stop.is_set():
            try:
                version = int(model.infer({"x": x})["version"][0, 0])
            except BaseException as exc:  # counted and printed: there should be none
                errors.append(exc)
                continue
            with lock:
                windows[-1][version] += 1

    with server:
        threads = [threading.Thread(target=caller) for _ in range(64)]
        for thread in threads:
            thread.start()
        for tick in range(12):
            time.sleep(0.1)
            if tick == 4:
                started = time.perf_counter()
                server.bind("Model", model_version(2), X, VERSION, ModelConfig(max_batch_size=32), version=2)
                print(f"version 2 bound and serving in {time.perf_counter() - started:.3f} s")
            with lock:
                windows.append(Counter())
        stop.set()
        for thread in threads:
            thread.join()
        for i, window in enumerate(windows[:-1]):
            print(f"{(i + 1) * 0.1:.1f} s: version 1: {window[1]:5d}  version 2: {window[2]:5d}")
        total = sum(windows, Counter())
        print(f"total: version 1: {total[1]}, version 2: {total[2]}, errors: {len(errors)}")
        print(f"version 1 ready: {server.model('Model', 1).ready}, version 2 ready: {server.model('Model', 2).ready}")


if __name__ == "__main__":
    main()
