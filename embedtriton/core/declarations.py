"""What ``bind`` and ``load`` check of a user's declarations beyond each object's own
validation: names that become folders, tensors, and the server-dependent parts of a config."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backend.batch import InferFunc, signature_problem
from ..config import ModelConfig, ServerConfig, Tensor
from ..errors import InvalidArgumentError
from ..triton.devices import require_gpu

NAME_MAX = 255  # bytes of a file name: a model's name is its folder in the model repository


def check_name(model_name: str) -> None:
    """A model's name: it names its folder in the model repository."""
    if not isinstance(model_name, str) or not model_name or "/" in model_name or model_name.startswith("."):
        raise InvalidArgumentError(f"model_name must be a plain non-empty name, not {model_name!r}")
    if "\0" in model_name or len(model_name.encode()) > NAME_MAX:
        raise InvalidArgumentError(
            f"model_name must be at most {NAME_MAX} bytes (UTF-8) without NUL characters: it names a folder "
            f"of the model repository ({model_name[:40]!r}{'...' if len(model_name) > 40 else ''} has "
            f"{len(model_name.encode())})"
        )


def check_declarations(
    model_name: str, infer_func: InferFunc, inputs: Sequence[Tensor], outputs: Sequence[Tensor]
) -> None:
    """A model's name, callable and tensors, as ``bind`` takes them."""
    check_name(model_name)
    if not callable(infer_func):
        raise InvalidArgumentError(f"infer_func of model '{model_name}' must be callable")
    problem = signature_problem(infer_func)
    if problem is not None:
        raise InvalidArgumentError(f"model '{model_name}': {problem}")
    for what, tensors in (("inputs", inputs), ("outputs", outputs)):
        if not all(isinstance(t, Tensor) for t in tensors):
            raise InvalidArgumentError(f"{what} of model '{model_name}' must be a list of Tensor")
    if not outputs:
        raise InvalidArgumentError(f"model '{model_name}' needs at least one output")
    for tensor in inputs:
        if tensor.labels is not None:
            raise InvalidArgumentError(
                f"model '{model_name}': input {tensor.name or '(unnamed)'} has labels; class labels "
                "belong to outputs (for clients that ask for the top classes)"
            )
    for tensor in outputs:
        if tensor.optional:
            raise InvalidArgumentError(
                f"model '{model_name}': output {tensor.name or '(unnamed)'} is optional; only inputs can be "
                "optional (a request may leave them out), every output is returned: drop optional=True"
            )
        if tensor.format is not None:
            raise InvalidArgumentError(
                f"model '{model_name}': output {tensor.name or '(unnamed)'} has format={tensor.format!r}; Triton's "
                "formats describe inputs (how clients lay out what they send): drop it from the output"
            )
    for tensor in [*inputs, *outputs]:
        if tensor.device == "gpu":
            require_gpu(f"model '{model_name}': Tensor {tensor.name or '(unnamed)'} with device='gpu'")


def check_config(model_name: str, config: ModelConfig, server: ServerConfig) -> None:
    """What a ModelConfig needs of the server (a cache, GPUs), as ``bind`` and ``load`` take it."""
    if not isinstance(config, ModelConfig):
        raise InvalidArgumentError(f"config must be a ModelConfig, not {type(config).__name__}")
    if config.response_cache and not server.cache_config:
        raise InvalidArgumentError(
            f"model '{model_name}' has response_cache=True but the server has no cache; "
            "configure one, e.g. Server(ServerConfig(cache_config=['local,size=1048576']))"
        )
    for group in config.instance_group or []:
        if group.kind == "GPU":
            for gpu in group.gpus or [0]:
                require_gpu(f"model '{model_name}': InstanceGroup(kind='GPU')", gpu)


def check_versions(model_name: str, versions: dict[int, Any]) -> None:
    """Versions of one model share Triton's model config (the highest version's): those that may
    be loaded together must declare the same tensors, batching and decoupled mode."""
    latest = versions[max(versions)]
    if latest.config.version_policy.serves_one():
        return
    for version, binding in versions.items():
        same = (
            [(t.name, t.dtype, t.shape, t.optional, t.format) for t in binding.inputs]
            == [(t.name, t.dtype, t.shape, t.optional, t.format) for t in latest.inputs]
            and [(t.name, t.dtype, t.shape) for t in binding.outputs]
            == [(t.name, t.dtype, t.shape) for t in latest.outputs]
            and binding.max_batch_size == latest.max_batch_size
            and binding.decoupled == latest.decoupled
        )
        if not same:
            raise InvalidArgumentError(
                f"model '{model_name}': versions {version} and {latest.version} may be served together "
                f"({latest.config.version_policy}) but declare different tensors, batching or decoupled mode; "
                "Triton gives all versions of a model one config: make them match, or serve one version at a "
                "time (VersionPolicy.latest(1), the default)"
            )
