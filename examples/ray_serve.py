"""Scale out with Ray Serve: two replicas, each embedding its own Triton.

Starts Ray on this machine, deploys two replicas of a batching model (each replica binds it on
its own embedded server), sends 1,000 requests from 50 concurrent callers through a Ray Serve
handle, and prints how many each replica took and how Triton batched them there. Then one
request over Ray Serve's HTTP proxy with Triton's KServe-v2 REST protocol, and shut down.

Needs ``pip install "embedtriton[ray]"``. Run it from the examples folder or anywhere but the
checkout's root (Ray's workers put the current directory first on sys.path, and the
checkout's ``embedtriton/`` would shadow the installed package)::

    cd examples && python ray_serve.py
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import urllib.request

import numpy as np

from embedtriton import ModelConfig, Server, Tensor, batch


@batch
def scale(x: np.ndarray) -> dict[str, np.ndarray]:
    time.sleep(0.005)  # 5 ms per call, whatever the batch: batching pays
    return {"y": x * 2}


def bind(server: Server) -> None:
    """Run in every replica: bind the models on its embedded server."""
    server.bind(
        "Scale",
        scale,
        inputs=[Tensor(name="x", dtype=np.float32, shape=(4,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(4,))],
        config=ModelConfig(max_batch_size=32),
    )


async def send(handle, requests: int, callers: int) -> int:
    """``requests`` requests from ``callers`` concurrent callers; the number answered right."""
    right = 0

    async def caller(k: int) -> None:
        nonlocal right
        for i in range(k, requests, callers):
            x = np.full((1, 4), i, dtype=np.float32)
            outputs = await handle.infer.remote("Scale", {"x": x})
            right += bool(np.array_equal(outputs["y"], x * 2))

    await asyncio.gather(*(caller(k) for k in range(callers)))
    return right


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    import ray
    from ray import serve

    from embedtriton.ray import replica_reports, triton_app

    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        app = triton_app(
            bind,
            num_replicas=2,
            ray_actor_options={"num_cpus": 1},
            max_ongoing_requests=32,  # enough to fill Triton's batches; fewer than the 50 callers, so both replicas get work
        )
        started = time.perf_counter()
        handle = serve.run(app, name="triton", route_prefix="/")
        print(f"2 replicas up in {time.perf_counter() - started:.1f} s")

        started = time.perf_counter()
        right = asyncio.run(send(handle, 1000, 50))
        print(f"1000 requests, {right} answered right, in {time.perf_counter() - started:.2f} s")
        for info in replica_reports(handle, 2):  # each replica's own numbers
            stats = info["models"]["Scale"]
            print(
                f"replica {info['replica']} (pid {info['pid']}): {info['requests']} requests, "
                f"Triton ran {stats['inference_count']} inferences in {stats['execution_count']} executions "
                f"(batch sizes {sorted(b['batch_size'] for b in stats['batch_stats'])})"
            )

        body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
        url = f"http://127.0.0.1:{port}/v2/models/Scale/infer"
        with urllib.request.urlopen(urllib.request.Request(url, body.encode(), method="POST"), timeout=30) as answer:
            print("over Ray Serve HTTP (KServe-v2 REST):", json.loads(answer.read())["outputs"][0]["data"])
    finally:
        serve.shutdown()
        ray.shutdown()
    print("shut down")


if __name__ == "__main__":
    main()
