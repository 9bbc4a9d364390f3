"""A bound ensemble: what the server keeps of ``bind_ensemble``. It has no callable (Triton's
ensemble scheduler runs its steps), but the server loads, unloads and addresses it as it does
a bound callable, through the same attributes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config import ModelConfig, Tensor, name_tensors
from ..config.ensemble import Step, StepModel, ensemble_config_json
from ..errors import InvalidArgumentError
from .declarations import check_config, check_name


class Ensemble:
    """An ensemble's declarations and its Triton config (checked when it is created)."""

    batch_rule = None  # (the attributes a bound callable has, as the server reads them)
    warmup_error = None
    version = 1

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

    def wait_finalized(self, timeout: float, delete_released: Callable[[], Any]) -> bool:
        """Nothing of ours runs in an ensemble: Triton lets go of it when it unloads it."""
        return True


def bind_ensemble(
    server: Any,
    model_name: str,
    steps: Sequence[Step],
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    config: ModelConfig | None,
) -> Any:
    """``CoreServer.bind_ensemble``: check, keep and (when the server runs) load an ensemble."""
    from .model import Model

    check_name(model_name)
    for what, tensors in (("inputs", inputs), ("outputs", outputs)):
        if not tensors or not all(isinstance(t, Tensor) and t.name for t in tensors):
            raise InvalidArgumentError(f"{what} of ensemble '{model_name}' must be a list of named Tensors")
    config = config if config is not None else ModelConfig()
    check_config(model_name, config, server.config)
    with server._lock:
        if model_name in server._bound:
            raise InvalidArgumentError(f"model '{model_name}' is already bound; unbind() it first")
        models = {n: StepModel(b.inputs, b.outputs, b.max_batch_size, b.decoupled) for n, b in server._bound.items()}
        ensemble = Ensemble(
            model_name, steps, name_tensors(inputs, "INPUT"), name_tensors(outputs, "OUTPUT"), config, models
        )
        server._bound[model_name] = ensemble
        if server._handle is not None:
            try:
                server._load(ensemble)
            except BaseException:
                del server._bound[model_name]
                raise
    return Model(server, model_name)
