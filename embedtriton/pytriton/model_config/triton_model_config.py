"""``TritonModelConfig``: a served model's configuration as the client's ``model_config`` and the
decorators (``@triton_context``) see it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .common import DeviceKind, DynamicBatcher, ModelWarmup

__all__ = ["ResponseCache", "TensorSpec", "TritonModelConfig"]


@dataclasses.dataclass
class ResponseCache:
    enable: bool


@dataclasses.dataclass
class TensorSpec:
    """A tensor's name, shape (without the batch axis), numpy dtype and whether it is optional."""

    name: str
    shape: tuple
    dtype: Any
    optional: bool | None = False


@dataclasses.dataclass
class TritonModelConfig:
    model_name: str
    model_version: int = 1
    max_batch_size: int = 4
    batching: bool = True
    batcher: DynamicBatcher | None = None
    instance_group: dict[DeviceKind, int | None] = dataclasses.field(default_factory=dict)
    decoupled: bool = False
    backend_parameters: dict[str, str] = dataclasses.field(default_factory=dict)
    inputs: Sequence[TensorSpec] | None = None
    outputs: Sequence[TensorSpec] | None = None
    response_cache: ResponseCache | None = None
    model_warmup: list[ModelWarmup] | None = None

    @property
    def backend(self) -> str:
        """The Triton backend that runs the model: embedtriton's own."""
        return "embedtriton"
