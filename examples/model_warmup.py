"""The minimal warm-up example of PyTriton's binding docs, on embedtriton.

Only the imports and the server object differ from the docs, and, since this script
should end by itself, `triton.run()` (serve forever) became start/infer/stop. The
function records the batches it saw: the warm-up ran before bind() returned.

    python examples/model_warmup.py
"""

import numpy as np

from embedtriton import ModelConfig, ModelWarmup, Tensor, WarmupInput, batch
from embedtriton import Server as Triton

seen = []


@batch
def infer_fn(INPUT_1, INPUT_2):
    seen.append((INPUT_1.shape, INPUT_2.shape))
    return {"OUTPUT_1": np.ones((1, 1), dtype=np.float32)}


# 1. Describe the warm-up traffic pattern
warmup = ModelWarmup(
    name="first-batch",
    batch_size=1,
    inputs={
        "INPUT_1": WarmupInput(dtype=np.float32, shape=(1,), random_data=True),
        "INPUT_2": WarmupInput(dtype=np.bytes_, shape=(1,), zero_data=True),
    },
    count=1,  # run one synthetic request of batch_size rows
)

# 2. Attach it to the model’s config
config = ModelConfig(
    max_batch_size=16,
    model_warmup=[warmup],
)

# 3. Bind the model as usual
triton = Triton()
triton.start()
triton.bind(
    model_name="MyModel",
    infer_func=infer_fn,  # your @batch function
    inputs=[
        Tensor(dtype=np.float32, shape=(1,)),
        Tensor(dtype=np.bytes_, shape=(1,)),
    ],
    outputs=[Tensor(dtype=np.float32, shape=(1,))],
    config=config,
    strict=True,
)
print(f"warm-up batches seen before the first request: {seen}")
data_float = np.ones((1, 1), dtype=np.float32)
data_bytes = np.array([[b"x"]], dtype=np.bytes_)
print(triton.model("MyModel").infer({"INPUT_1": data_float, "INPUT_2": data_bytes}))
triton.stop()
