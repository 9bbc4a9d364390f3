"""Tune a model's batching config with the built-in tuner, in process, in seconds.

The model costs a fixed 2 ms per call plus 0.05 ms per row (it sleeps, releasing the GIL, as a
GPU kernel launch would): bound with ``max_batch_size=1`` it serves one row per 2 ms. The tuner
re-binds it with larger batches, queue delays, preferred sizes and more instances, measures each
candidate under 1 and 32 requests in flight, and picks the highest throughput whose p99 latency
stays within 10 ms. The same from a shell::

    cd examples && embedtriton tune tuning:bind --model Costly --concurrency 1,32 --latency-budget-ms 10

Both write ``tuning-report/`` in the current folder (this script: or the folder given as its
first argument; the command: ``--output DIR``): ``report.json``, ``best_config.py`` and, with
matplotlib installed, ``report.png``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from embedtriton import ModelConfig, Server, Tensor, batch
from embedtriton.tuning import tune


@batch
def costly(x: np.ndarray) -> dict[str, np.ndarray]:
    time.sleep(0.002 + 0.00005 * len(x))  # 2 ms per call + 0.05 ms per row
    return {"y": x * 2}


def bind(server: Server) -> None:
    """Bind the model as a first guess would: no batching to speak of."""
    server.bind(
        "Costly",
        costly,
        inputs=[Tensor(name="x", dtype=np.float32, shape=(16,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(16,))],
        config=ModelConfig(max_batch_size=1),
    )


def main(output: str = "tuning-report") -> None:
    server = Server()
    bind(server)
    with server:
        report = tune(server, "Costly", concurrency=[1, 32], latency_budget_ms=10.0, time_budget_s=30, window_s=0.5)
        print(report.table(rows=10))
        print()
        print(report.summary())
        written = report.save(output)
        print("written:", ", ".join(str(p) for p in written))
        print((Path(output) / "best_config.py").read_text())  # the ModelConfig to bind with from now on


if __name__ == "__main__":
    main(*sys.argv[1:2])
