"""``Tensor``: a model input or output as PyTriton declares it (``shape`` and ``dtype`` first,
so ``Tensor((1,), np.float32)`` works as there)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["Tensor"]


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A model input or output: ``shape`` without the batch axis (``-1``: any size), ``dtype``
    (``np.bytes_``/``bytes``/``object`` for Triton BYTES), ``name`` (unnamed tensors become
    ``INPUT_1``..., ``OUTPUT_1``...), ``optional`` (inputs only: a request may leave it out)."""

    shape: tuple
    dtype: Any
    name: str | None = None
    optional: bool | None = False

    def __post_init__(self) -> None:
        if isinstance(self.dtype, np.dtype):
            object.__setattr__(self, "dtype", self.dtype.type)
