"""AddSub on the KServe-v2 gRPC endpoint, called by the stock Triton client, with tracing.

Serves the model on 127.0.0.1 (a free port), then, as another program would:
- calls it with ``tritonclient.grpc`` (tensors in the message), passing a W3C
  ``traceparent`` so the server's spans join the caller's trace;
- calls it again with the tensors in a system shared-memory region (same-host zero-copy:
  the model reads the client's memory and the outputs are written straight into it);
- asks ``grpc.health.v1`` whether the server and the model are serving;
- prints the OpenTelemetry spans the server built from Triton's timestamps.

    pip install "embedtriton[grpc,tracing]"
    python examples/grpc_serving.py
"""

from __future__ import annotations

import time

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from embedtriton import ModelConfig, Server, ServerConfig, Tensor, Tracing, batch


@batch
def add_sub(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    return {"add": a + b, "sub": a - b}


def main() -> None:
    spans = InMemorySpanExporter()  # an application would export to its collector instead
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))

    server = Server(ServerConfig(tracing=Tracing(tracer_provider=provider)))
    server.bind(
        model_name="AddSub",
        infer_func=add_sub,
        inputs=[Tensor(name="a", dtype=np.float32, shape=(-1,)), Tensor(name="b", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="add", dtype=np.float32, shape=(-1,)), Tensor(name="sub", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=8),
    )
    with server:
        port = server.serve_grpc("127.0.0.1:0")
        address = f"127.0.0.1:{port}"
        print(f"serving gRPC on {address}")

        # 1. a plain call, as part of the caller's trace
        client = grpcclient.InferenceServerClient(address)
        a = np.array([[1.0, 2.0, 3.0]], np.float32)
        b = np.array([[10.0, 20.0, 30.0]], np.float32)
        inputs = [grpcclient.InferInput("a", [1, 3], "FP32"), grpcclient.InferInput("b", [1, 3], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        result = client.infer("AddSub", inputs, headers={"traceparent": traceparent})
        print(f"add = {result.as_numpy('add').ravel()}, sub = {result.as_numpy('sub').ravel()}")

        # 2. the same through system shared memory: inputs at offset 0, outputs after them
        region = shm.create_shared_memory_region("addsub", "/embedtriton-example", 4 * a.nbytes)
        try:
            shm.set_shared_memory_region(region, [a, b])
            client.register_system_shared_memory("addsub", "/embedtriton-example", 4 * a.nbytes)
            inputs[0].set_shared_memory("addsub", a.nbytes, offset=0)
            inputs[1].set_shared_memory("addsub", b.nbytes, offset=a.nbytes)
            outputs = [grpcclient.InferRequestedOutput("add"), grpcclient.InferRequestedOutput("sub")]
            outputs[0].set_shared_memory("addsub", a.nbytes, offset=2 * a.nbytes)
            outputs[1].set_shared_memory("addsub", a.nbytes, offset=3 * a.nbytes)
            client.infer("AddSub", inputs, outputs=outputs)
            added = shm.get_contents_as_numpy(region, np.float32, [1, 3], offset=2 * a.nbytes)
            print(f"shared memory: add = {added.ravel()} (read from the region)")
            client.unregister_system_shared_memory("addsub")
        finally:
            shm.destroy_shared_memory_region(region)

        # 3. health, as an orchestrator's probe sees it
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(address))
        for service in ("", "AddSub"):
            status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
            print(f"health of {service or 'the server'!r}: {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}")

    # 4. what the tracer recorded (the first call: its parent is the caller's span)
    time.sleep(0.1)
    for span in sorted(spans.get_finished_spans(), key=lambda s: s.start_time):
        if format(span.context.trace_id, "032x") == traceparent.split("-")[1]:
            took = (span.end_time - span.start_time) / 1000
            print(f"span {span.name:8} {took:8.1f} µs  parent {format(span.parent.span_id, '016x')}")


if __name__ == "__main__":
    main()
