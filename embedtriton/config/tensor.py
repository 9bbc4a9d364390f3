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
    """An input or output of a model: ``Tensor(name=None, dtype, shape, device="cpu", optional=False, format=None)``.

    ``shape`` excludes the batch axis; ``-1`` marks a variable dimension. ``dtype`` is a
    numpy dtype; ``np.bytes_`` or ``object`` means Triton BYTES. Unnamed inputs are named
    ``INPUT_1``, ``INPUT_2``, ...; unnamed outputs ``OUTPUT_1``, ...
    ``device``: where the model wants the tensor, ``"cpu"`` or ``"gpu"`` (needs a CUDA GPU).
    ``labels`` (outputs): the class names of an output's elements, by index, for Triton's
    classification extension: a client that asks for the top ``k`` classes of this output gets
    ``"value:index:label"`` strings (Triton's ``label_filename``).
    ``optional`` (inputs): a request may leave this input out (Triton's ``optional: true``); the
    callable then gets a request without that key. Outputs cannot be optional.
    ``format`` (inputs): Triton's input format, ``"NHWC"`` or ``"NCHW"`` for an image input of 3
    dimensions (without the batch axis), as clients such as Triton's ``image_client.py`` read it
    from the model config to lay out what they send; ``None`` (Triton's ``FORMAT_NONE``) otherwise.
    """

    name: str | None
    dtype: np.dtype
    shape: tuple[int, ...]
    device: str
    labels: tuple[str, ...] | None
    optional: bool
    format: str | None

    def __init__(
        self,
        name: str | None = None,
        dtype: Any = None,
        shape: Sequence[int] | None = None,
        device: str = "cpu",
        labels: Sequence[str] | None = None,
        optional: bool = False,
        format: str | None = None,
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
        object.__setattr__(self, "format", _input_format(name, format, dims))


FORMATS = ("NHWC", "NCHW")  # Triton's ModelInput.Format (besides FORMAT_NONE)


def _input_format(name: str | None, given: Any, dims: tuple[int, ...]) -> str | None:
    """``format`` as Triton names it without its prefix ("NHWC", "NCHW"), or None."""
    if given is None:
        return None
    key = given.upper().removeprefix("FORMAT_") if isinstance(given, str) else None
    if key == "NONE":
        return None
    if key not in FORMATS:
        raise InvalidArgumentError(
            f"Tensor {name or '(unnamed)'}: format must be 'NHWC' or 'NCHW' (Triton's input formats) or None, "
            f"not {given!r}"
        )
    if len(dims) != 3:  # Triton's rule: "model input NHWC/NCHW require 3 dims"
        example = "(224, 224, 3)" if key == "NHWC" else "(3, 224, 224)"
        raise InvalidArgumentError(
            f"Tensor {name or '(unnamed)'}: format {key} needs 3 dimensions without the batch axis, e.g. "
            f"shape={example}; got shape {dims}"
        )
    return key


def name_of(tensor: Tensor) -> str:
    """The name of a tensor that :func:`name_tensors` has seen (every bound model's): never None."""
    return tensor.name  # type: ignore[return-value]  # named by name_tensors


def name_tensors(tensors: Sequence[Tensor], prefix: str) -> list[Tensor]:
    """Give unnamed tensors their positional names (INPUT_1, ...) and check for duplicates."""
    named = [
        t
        if t.name
        else Tensor(
            name=f"{prefix}_{i}",
            dtype=t.dtype,
            shape=t.shape,
            device=t.device,
            labels=t.labels,
            optional=t.optional,
            format=t.format,
        )
        for i, t in enumerate(tensors, start=1)
    ]
    names = [name_of(t) for t in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidArgumentError(f"tensor names must be unique; repeated: {duplicates}")
    return named
