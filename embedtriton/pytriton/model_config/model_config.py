"""``ModelConfig``: how Triton serves a bound callable, with PyTriton's fields and defaults."""

from __future__ import annotations

import dataclasses

from .common import DynamicBatcher, ModelWarmup

__all__ = ["ModelConfig"]


@dataclasses.dataclass
class ModelConfig:
    """``batching`` (a batch axis on every input and output), ``max_batch_size`` (>= 1 when
    batching), ``batcher`` (the dynamic batcher), ``response_cache`` (needs
    ``TritonConfig(cache_config=...)``), ``decoupled`` (a generator callable streams responses),
    ``model_warmup`` (stages Triton runs before the model serves)."""

    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher = dataclasses.field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False
    model_warmup: list[ModelWarmup] | None = None
