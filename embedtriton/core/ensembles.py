"""A bound ensemble: what the server keeps of ``bind_ensemble``. It has no callable (Triton's
ensemble scheduler runs its steps), but the server loads, unloads and addresses it as it does
a bound callable, through the same attributes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config import ModelConfig, Tensor
from ..config.ensemble import Step, StepModel, ensemble_config_json


class Ensemble:
    """An ensemble's declarations and its Triton config (checked when it is created)."""

    batch_rule = None  # (the attributes a bound callable has, as the server reads them)
    warmup_error = None

    def __init__(
        self,
        name: str,
        steps: Sequence[Step],
        inputs: list[Tensor],
        outputs: list[Tensor],
        config: ModelConfig,
        models: Mapping[str, StepModel],
    ) -> None:
        self.name = name
        self.steps = list(steps)
        self.inputs = inputs
        self.outputs = outputs
        self.config = config
        self._json = ensemble_config_json(name, self.steps, inputs, outputs, config, models)
        self.decoupled = config.decoupled
        self.max_batch_size = config.max_batch_size if config.batching else 0
        self.loaded_at = 0.0
        self.warming = False

    @property
    def step_models(self) -> set[str]:
        """The names of the models its steps run."""
        return {step.model_name for step in self.steps}

    def triton_config(self, library_path: str) -> dict[str, Any]:
        """Triton's config (``library_path`` is for bound callables; an ensemble has none)."""
        return self._json

    def wait_finalized(self, timeout: float, drain: Callable[[], Any]) -> bool:
        """Nothing of ours runs in an ensemble: Triton lets go of it when it unloads it."""
        return True
