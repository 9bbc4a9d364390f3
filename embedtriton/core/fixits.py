"""Triton's input errors retold for the caller: what to change in the call, in numpy terms.

Runs on the error path only: a request Triton refused is compared with the model's
declarations to say which inputs lack the batch axis or are not arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    from ..backend.binding import Binding

# What Triton says when it refuses an input for its dtype or shape (our own checks say what to fix already).
_TRITON_INPUT_ERRORS = (
    "inputs but got",
    "data-type is",
    "unexpected shape",
    "batch dimension",
    "batch size does not match",
)
_TRITON_NOTE = " NOTE: "  # Triton's advice on max_batch_size and the model config, for config writers


def explain_inputs(
    model: str, binding: Binding | None, inputs: Mapping[str, Any], error: InvalidArgumentError
) -> InvalidArgumentError:
    """The error to raise for ``inputs`` that Triton refused with ``error``."""
    message = str(error)
    if binding is None or not isinstance(inputs, Mapping) or not any(p in message for p in _TRITON_INPUT_ERRORS):
        return error
    declared = {t.name: t for t in binding.inputs}
    batched = binding.max_batch_size > 0
    if "inputs but got" in message:  # Triton counts them: "expected 2 inputs but got 3 inputs ..."
        names = [str(t.name) for t in binding.inputs]  # (named by bind)
        optional = sorted(str(t.name) for t in binding.inputs if t.optional)
        unexpected = sorted(str(k) for k in set(inputs) - set(names))
        missing = sorted(set(names) - set(optional) - set(inputs))
        said = []
        if unexpected:
            said.append(f"unexpected input{'s' if len(unexpected) > 1 else ''} {unexpected}")
        if missing:
            said.append(f"missing input{'s' if len(missing) > 1 else ''} {missing}")
        if said:
            return InvalidArgumentError(
                f"model '{model}': {' and '.join(said)}; its inputs are {sorted(names)}"
                + (f" (optional: {optional})" if optional else "")
            )
    not_arrays = []
    for name, value in inputs.items():
        tensor = declared.get(name)
        if tensor is None or isinstance(value, np.ndarray) or hasattr(value, "__dlpack__"):
            continue
        kind = "a list" if isinstance(value, (list, tuple)) else f"a {type(value).__name__}"
        dtype = "object (bytes)" if tensor.dtype.kind == "O" else tensor.dtype.name
        shape = _shape((1, *tensor.shape) if batched else tensor.shape)
        not_arrays.append(f"input '{name}' is {kind}: pass a numpy array of dtype {dtype} and shape {shape}")
    if not_arrays:
        return InvalidArgumentError(
            f"model '{model}': {'; '.join(not_arrays)} (np.asarray(value, dtype=...) converts it)"
        )
    if "data-type is" in message:
        wrong = [
            f"input '{name}' is {value.dtype.name} but the model takes {declared[name].dtype.name}: "
            f"pass {name}.astype(np.{declared[name].dtype.name})"
            for name, value in inputs.items()
            if name in declared
            and isinstance(value, np.ndarray)
            and declared[name].dtype.kind != "O"
            and value.dtype != declared[name].dtype
        ]
        if wrong:
            return InvalidArgumentError(f"model '{model}': {'; '.join(wrong)}")
    if batched:
        lacking = [
            f"'{name}' (shape {tuple(value.shape)})"
            for name, value in inputs.items()
            if name in declared and getattr(value, "ndim", None) == len(declared[name].shape)
        ]
        if lacking:
            return InvalidArgumentError(
                f"model '{model}' takes batches (max_batch_size={binding.max_batch_size}) but input"
                f"{'s' if len(lacking) > 1 else ''} {', '.join(lacking)} lack{'' if len(lacking) > 1 else 's'} "
                "the batch axis: add the batch axis (shape (1, ...), e.g. x[np.newaxis]) "
                "or bind with ModelConfig(batching=False)"
            )
    if _TRITON_NOTE in message:
        return InvalidArgumentError(message.split(_TRITON_NOTE, 1)[0])
    return error


def _shape(dims: tuple[int, ...]) -> str:
    return "(" + ", ".join("n" if d < 0 else str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"
