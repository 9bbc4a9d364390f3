"""A model's inputs and outputs as the user declares them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from ..tensors import as_numpy_dtype, triton_dtype

MAX_DIMS = 32  # dimensions of a tensor, batch axis included (the native data path's bound)


@dataclass(frozen=True, init=False)
class Tensor:
    """An input or output of a model: ``Tensor(name=None, dtype, shape, device="cpu", optional=False)``.

    ``shape`` excludes the batch axis; ``-1`` marks a variable dimension. ``dtype`` is a
    numpy dtype; ``np.bytes_`` or ``object`` means Triton BYTES. Unnamed inputs are named
    ``INPUT_1``, ``INPUT_2``, ...; unnamed outputs ``OUTPUT_1``, ...
    ``device``: where the model wants the tensor, ``"cpu"`` or ``"gpu"`` (needs a CUDA GPU).
    ``labels`` (outputs): the class names of an output's elements, by index, for Triton's
    classification extension: a client that asks for the top ``k`` classes of this output gets
    ``"value:index:label"`` strings (Triton's ``label_filename``).
    ``optional`` (inputs): a request may leave this input out (Triton's ``optional: true``); the
    callable then gets a request without that key. Outputs cannot be optional.
    """

    name: str | None
    dtype: np.dtype
    shape: tuple[int, ...]
    device: str
    labels: tuple[str, ...] | None
    optional: bool

    def __init__(
        self,
        name: str | None = None,
        dtype: Any = None,
        shape: Sequence[int] | None = None,
        device: str = "cpu",
        labels: Sequence[str] | None = None,
        optional: bool = False,
    ):
        if dtype is None or shape is None:
            raise InvalidArgumentError("Tensor needs a dtype and a shape, e.g. Tensor(dtype=np.float32, shape=(1,))")
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidArgumentError(f"Tensor name must be a non-empty string, not {name!r}")
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"Tensor shape must be a sequence of ints, not {shape!r}") from None
        if any(d < -1 or d == 0 for d in dims):
            raise InvalidArgumentError(f"Tensor shape {dims}: dimensions must be positive or -1 (variable)")
        if len(dims) > MAX_DIMS - 1:  # room for the batch axis
            raise InvalidArgumentError(
                f"Tensor shape {dims} has {len(dims)} dimensions; at most {MAX_DIMS - 1} (plus the batch axis)"
            )
        np_dtype = as_numpy_dtype(dtype)
        triton_dtype(np_dtype, f"tensor {name or '(unnamed)'}")  # raises for dtypes Triton lacks
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "dtype", np_dtype)
        object.__setattr__(self, "shape", dims)
        if device not in ("cpu", "gpu"):
            raise InvalidArgumentError(f"Tensor device must be 'cpu' or 'gpu', not {device!r}")
        object.__setattr__(self, "device", device)
        if labels is not None:
            if isinstance(labels, str) or not all(isinstance(x, str) and "\n" not in x for x in labels):
                raise InvalidArgumentError(
                    f"Tensor {name or '(unnamed)'}: labels must be a list of strings without newlines, "
                    "one per class index, e.g. labels=['cat', 'dog']"
                )
            labels = tuple(labels)
        object.__setattr__(self, "labels", labels)
        if not isinstance(optional, (bool, np.bool_)):
            raise InvalidArgumentError(
                f"Tensor {name or '(unnamed)'}: optional must be True or False, not {optional!r}"
            )
        object.__setattr__(self, "optional", bool(optional))


def name_tensors(tensors: Sequence[Tensor], prefix: str) -> list[Tensor]:
    """Give unnamed tensors their positional names (INPUT_1, ...) and check for duplicates."""
    named = [
        t
        if t.name
        else Tensor(
            name=f"{prefix}_{i}", dtype=t.dtype, shape=t.shape, device=t.device, labels=t.labels, optional=t.optional
        )
        for i, t in enumerate(tensors, start=1)
    ]
    names = [t.name for t in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidArgumentError(f"tensor names must be unique; repeated: {duplicates}")
    return named
