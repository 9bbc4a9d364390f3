"""A network-facing endpoint that stops without dropping a request.

Serves a slow model over gRPC with explicit limits on what one client may cost
(``GrpcLimits``) and shared memory turned off (it is for same-host trusted clients), then:
- a client's request is in flight when ``stop()`` begins;
- during the drain, health checks answer NOT_SERVING and a new request gets UNAVAILABLE;
- the request in flight still gets its answer, and ``stop()`` returns well within
  ``exit_timeout_secs``.

``embedtriton serve`` does the same on SIGINT/SIGTERM (a second signal exits at once).

    pip install "embedtriton[grpc]"
    python examples/graceful_stop.py
"""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from embedtriton import GrpcLimits, ModelConfig, Server, ServerConfig, Tensor, batch


@batch
def slow_double(x: np.ndarray) -> dict[str, np.ndarray]:
    time.sleep(1.0)  # a model that takes its time
    return {"y": x * 2}


def main() -> None:
    server = Server(ServerConfig(exit_timeout_secs=10))
    server.bind(
        "SlowDouble",
        slow_double,
        inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
        outputs=[Tensor(name="y", dtype=np.float32, shape=(1,))],
        config=ModelConfig(max_batch_size=4),
    )
    server.start()
    limits = GrpcLimits(max_connections=64, idle_timeout_s=60, max_header_list_bytes=8192)
    port = server.serve_grpc("127.0.0.1:0", limits=limits, shared_memory=False)
    address = f"127.0.0.1:{port}"
    print(f"serving gRPC on {address} with {limits}")

    client = grpcclient.InferenceServerClient(address)
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.full((1, 1), 21, np.float32))
    answers: list = []
    client.async_infer("SlowDouble", [x], callback=lambda result, error: answers.append((result, error)))
    time.sleep(0.2)  # the request is running

    started = time.monotonic()
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    time.sleep(0.2)  # draining now
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(address))
    status = health.Check(health_pb2.HealthCheckRequest(service="")).status
    print(f"during the drain: health {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}")
    try:
        client.infer("SlowDouble", [x])
    except InferenceServerException as exc:
        print(f"during the drain: a new request gets {exc.status()}: {exc.message()}")

    stopper.join()
    stopped_after = time.monotonic() - started
    while not answers:  # the reply left before stop() returned; the client's thread hands it over
        time.sleep(0.01)
    result, error = answers[0]
    print(f"the request in flight: y = {result.as_numpy('y')[0, 0]} (error: {error})")
    print(f"stop() returned after {stopped_after:.1f} s (exit_timeout_secs=10)")


if __name__ == "__main__":
    main()
