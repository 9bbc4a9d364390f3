"""The models this image serves: replace the example with yours.

`embedtriton serve models:bind` (the image's ENTRYPOINT with the Deployment's args) imports this
module from the image's working folder and calls ``bind(server)`` once per pod, before any port
opens: the pod turns ready only once every model bound here has loaded and run its warm-up, so
do the slow work (loading weights, compiling) in ``bind`` or in a warm-up, never on the first
request. Keep the function's name, or change the target in deploy/k8s/deployment.yaml.
"""

import numpy as np

from embedtriton import DynamicBatcher, ModelConfig, ModelWarmup, Tensor, WarmupInput, batch


@batch
def add_sub(a, b):
    return {"add": a + b, "sub": a - b}


def bind(server):
    inputs = [Tensor(name="a", dtype=np.float32, shape=(-1,)), Tensor(name="b", dtype=np.float32, shape=(-1,))]
    outputs = [Tensor(name="add", dtype=np.float32, shape=(-1,)), Tensor(name="sub", dtype=np.float32, shape=(-1,))]
    zeros = {name: WarmupInput(dtype=np.float32, shape=(16,), zero_data=True) for name in ("a", "b")}
    server.bind(
        "AddSub",
        add_sub,
        inputs=inputs,
        outputs=outputs,
        config=ModelConfig(
            max_batch_size=64,
            # Triton waits up to 100 µs to fill a batch: that wait counts as queue time, which the
            # HorizontalPodAutoscaler (deploy/k8s/hpa.yaml) scales on, so keep its target above it.
            batcher=DynamicBatcher(max_queue_delay_microseconds=100),
            model_warmup=[ModelWarmup(name="zeros", batch_size=8, inputs=zeros)],
        ),
    )
