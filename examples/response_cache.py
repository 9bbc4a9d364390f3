"""The response-cache example of PyTriton's binding docs, on embedtriton.

Only the imports and the server object differ from the docs (and the tensors carry the
names the function returns: a, b, add, sub). A repeated request is answered from Triton's
response cache without calling the function.

    python examples/response_cache.py
"""

import numpy as np

from embedtriton import ModelConfig, Tensor, batch
from embedtriton import Server as Triton
from embedtriton import ServerConfig as TritonConfig

calls = 0

triton_config = TritonConfig(
    cache_config=[f"local,size={1024 * 1024}"],  # 1MB
)


@batch
def _add_sub(**inputs):
    global calls
    calls += 1
    a_batch, b_batch = inputs.values()
    add_batch = a_batch + b_batch
    sub_batch = a_batch - b_batch
    return {"add": add_batch, "sub": sub_batch}


with Triton(config=triton_config) as triton:
    triton.bind(
        model_name="AddSub",
        infer_func=_add_sub,
        inputs=[Tensor(name="a", shape=(1,), dtype=np.float32), Tensor(name="b", shape=(1,), dtype=np.float32)],
        outputs=[Tensor(name="add", shape=(1,), dtype=np.float32), Tensor(name="sub", shape=(1,), dtype=np.float32)],
        config=ModelConfig(max_batch_size=8, response_cache=True),
    )
    model = triton.model("AddSub")
    request = {"a": np.array([[1.0]], np.float32), "b": np.array([[2.0]], np.float32)}
    for _ in range(3):
        print(model.infer(request))
    stats = model.statistics()["inference_stats"]
    print(f"3 identical requests, {calls} call(s) of the function; cache hits: {stats['cache_hit']['count']}")
