"""Version 2 of a repository model written as a Python callable: y = x + 2.

A version folder's model.py defines infer_func (plain or @batch), inputs and outputs (lists of
Tensor) and optionally config (a ModelConfig); no config.pbtxt is needed.
"""

import numpy as np

from embedtriton import ModelConfig, Tensor, batch


@batch
def infer_func(x):
    return {"y": x + 2}


inputs = [Tensor(name="x", dtype=np.float32, shape=(1,))]
outputs = [Tensor(name="y", dtype=np.float32, shape=(1,))]
config = ModelConfig(max_batch_size=8)
