"""PyTriton's declarations translated to embedtriton's own (validated) ones, and Triton's model
config (JSON) read back as PyTriton's ``TritonModelConfig``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import config as et
from ..errors import InvalidArgumentError
from ..tensors import BY_NAME
from .exceptions import PyTritonModelConfigError, PyTritonValidationError
from .model_config import common
from .model_config.model_config import ModelConfig
from .model_config.tensor import Tensor
from .model_config.triton_model_config import ResponseCache, TensorSpec, TritonModelConfig


def tensors(declared: Sequence[Any], prefix: str) -> list[et.Tensor]:
    """PyTriton Tensors (or embedtriton's) as embedtriton Tensors, unnamed ones named
    ``INPUT_1``... / ``OUTPUT_1``... by position."""
    out = []
    for i, t in enumerate(declared, start=1):
        if isinstance(t, et.Tensor):
            t = Tensor(shape=t.shape, dtype=t.dtype, name=t.name, optional=t.optional)
        if not isinstance(t, Tensor):
            raise PyTritonValidationError(f"inputs and outputs must be Tensor objects, not {type(t).__name__}")
        try:
            out.append(
                et.Tensor(name=t.name or f"{prefix}_{i}", dtype=t.dtype, shape=t.shape, optional=bool(t.optional))
            )
        except InvalidArgumentError as exc:
            raise PyTritonValidationError(str(exc)) from None
    return out


def model_config(config: Any, instances: int) -> et.ModelConfig:
    """embedtriton's ModelConfig for PyTriton's (``instances`` callables: that many instances)."""
    group = [et.InstanceGroup(count=instances)] if instances > 1 else None
    try:
        if isinstance(config, et.ModelConfig):  # embedtriton's own is taken as it is
            return config if group is None else _replace(config, instance_group=group)
        if not isinstance(config, ModelConfig):
            raise PyTritonModelConfigError(f"config must be a ModelConfig, not {type(config).__name__}")
        return et.ModelConfig(
            batching=config.batching,
            max_batch_size=config.max_batch_size,
            batcher=_batcher(config.batcher),
            response_cache=config.response_cache,
            decoupled=config.decoupled,
            model_warmup=[_warmup(w) for w in config.model_warmup] if config.model_warmup else None,
            instance_group=group,
        )
    except InvalidArgumentError as exc:
        if isinstance(exc, PyTritonModelConfigError):
            raise
        raise PyTritonModelConfigError(str(exc)) from None


def _replace(config: et.ModelConfig, **changes: Any) -> et.ModelConfig:
    return dataclasses.replace(config, **changes)


def _policy(policy: Any) -> et.QueuePolicy | None:
    if policy is None or isinstance(policy, et.QueuePolicy):
        return policy
    return et.QueuePolicy(
        timeout_action=et.TimeoutAction(getattr(policy.timeout_action, "value", policy.timeout_action)),
        default_timeout_microseconds=policy.default_timeout_microseconds,
        allow_timeout_override=policy.allow_timeout_override,
        max_queue_size=policy.max_queue_size,
    )


def _batcher(batcher: Any) -> et.DynamicBatcher:
    if batcher is None:
        return et.DynamicBatcher()
    if isinstance(batcher, et.DynamicBatcher):
        return batcher
    if not isinstance(batcher, common.DynamicBatcher):
        raise PyTritonModelConfigError(f"ModelConfig.batcher must be a DynamicBatcher, not {type(batcher).__name__}")
    return et.DynamicBatcher(
        max_queue_delay_microseconds=batcher.max_queue_delay_microseconds,
        preferred_batch_size=list(batcher.preferred_batch_size) if batcher.preferred_batch_size else None,
        preserve_ordering=batcher.preserve_ordering,
        priority_levels=batcher.priority_levels,
        default_priority_level=batcher.default_priority_level,
        default_queue_policy=_policy(batcher.default_queue_policy),
        priority_queue_policy={int(k): _policy(v) for k, v in batcher.priority_queue_policy.items()}  # type: ignore[misc]
        if batcher.priority_queue_policy
        else None,
    )


def _warmup(stage: Any) -> et.ModelWarmup:
    if isinstance(stage, et.ModelWarmup):
        return stage
    inputs = {
        name: w
        if isinstance(w, et.WarmupInput)
        else et.WarmupInput(
            dtype=w.dtype,
            shape=tuple(w.shape),
            zero_data=bool(w.zero_data),
            random_data=bool(w.random_data),
            input_data_file=w.input_data_file,
        )
        for name, w in stage.inputs.items()
    }
    return et.ModelWarmup(name=stage.name, batch_size=stage.batch_size, inputs=inputs, count=stage.count)


def served_config(
    name: str, version: int, inputs: list[et.Tensor], outputs: list[et.Tensor], config: Any, ours: et.ModelConfig
) -> TritonModelConfig:
    """The TritonModelConfig that decorators and ``@triton_context`` see for a bound model
    (``config`` as the user gave it, ``ours`` its translation)."""
    batcher = config.batcher if isinstance(config, ModelConfig) else None
    instances = sum(g.count for g in ours.instance_group or [et.InstanceGroup()])
    return TritonModelConfig(
        model_name=name,
        model_version=version,
        max_batch_size=ours.max_batch_size if ours.batching else 0,
        batching=ours.batching,
        batcher=batcher if batcher is not None else common.DynamicBatcher(),
        instance_group={common.DeviceKind.KIND_CPU: instances},
        decoupled=ours.decoupled,
        inputs=[TensorSpec(t.name, t.shape, _spec_dtype(t.dtype), t.optional) for t in inputs],  # type: ignore[arg-type]
        outputs=[TensorSpec(t.name, t.shape, _spec_dtype(t.dtype)) for t in outputs],  # type: ignore[arg-type]
        response_cache=ResponseCache(enable=True) if ours.response_cache else None,
        model_warmup=getattr(config, "model_warmup", None),
    )


def _spec_dtype(dtype: np.dtype) -> Any:
    return np.bytes_ if dtype.kind in "OSU" else dtype.type


def parse_triton_config(config: dict[str, Any]) -> TritonModelConfig:
    """Triton's model config JSON (``get_model_config``, HTTP or gRPC's ``as_json``) as a
    TritonModelConfig, field by field as PyTriton's client reads it: the dynamic batcher with its
    queue policies, ``parameters`` as ``backend_parameters`` (name -> string value), the response
    cache and the warm-up stages; the same errors for what cannot be read."""
    dynamic = config.get("dynamic_batching")
    groups = {common.DeviceKind(entry["kind"]): entry.get("count") for entry in config.get("instance_group", [])}
    parameters = config.get("parameters", [])
    if isinstance(parameters, list):
        backend_parameters = dict.fromkeys(parameters, "")
    elif isinstance(parameters, dict):
        backend_parameters = {name: value["string_value"] for name, value in parameters.items()}
    else:
        raise TypeError(f"Invalid type for backend_parameters_config: {type(parameters)}")
    cache = config.get("response_cache")
    warmup = config.get("model_warmup")
    max_batch_size = int(config.get("max_batch_size", 0))
    return TritonModelConfig(
        model_name=config["name"],
        max_batch_size=max_batch_size,
        batching=max_batch_size > 0,
        batcher=_parse_batcher(dynamic) if dynamic is not None else None,
        instance_group=groups,
        decoupled=bool(config.get("model_transaction_policy", {}).get("decoupled", False)),
        backend_parameters=backend_parameters,
        inputs=[_parse_spec(item, "input", i) for i, item in enumerate(config.get("input", []))] or None,
        outputs=[_parse_spec(item, "output", i) for i, item in enumerate(config.get("output", []))] or None,
        response_cache=ResponseCache(enable=bool(cache["enable"])) if cache else None,
        model_warmup=[_parse_warmup(stage) for stage in warmup] if warmup else None,
    )


def _parse_dtype(data_type: Any, what: str) -> Any:
    """A Triton ``TYPE_*`` name as the numpy dtype PyTriton's client gives it (``np.bytes_`` for
    strings); ``what`` names the tensor in the errors, as PyTriton words them."""
    if not data_type:
        raise PyTritonModelConfigError(f"Data type for {what} not defined.")
    parts = str(data_type).split("_")
    if len(parts) != 2:
        raise PyTritonModelConfigError(
            f"Invalid data type `{data_type}` for {what} not defined. The expected name is TYPE_{{type}}."
        )
    if parts[1] in ("STRING", "BYTES"):
        return np.bytes_
    found = BY_NAME.get(parts[1])
    if found is None or found.numpy is None:
        raise PyTritonModelConfigError(f"Unsupported data type `{data_type}` for {what}")
    return found.numpy.type


def _parse_spec(item: dict[str, Any], io_type: str, index: int) -> TensorSpec:
    name = item.get("name")
    if not name:
        raise PyTritonModelConfigError(f"Name for {io_type} at index {index} not provided.")
    dtype = _parse_dtype(item.get("data_type"), f"{io_type} with name `{name}`")
    dims = item.get("dims", [])
    if not dims:
        raise PyTritonModelConfigError(f"Dimension for {io_type} with name `{name}` not defined.")
    return TensorSpec(name, tuple(int(d) for d in dims), dtype, item.get("optional", False))


def _parse_policy(policy: dict[str, Any]) -> common.QueuePolicy:
    return common.QueuePolicy(
        timeout_action=common.TimeoutAction(policy.get("timeout_action", common.TimeoutAction.REJECT.value)),
        default_timeout_microseconds=int(policy.get("default_timeout_microseconds", 0)),
        allow_timeout_override=bool(policy.get("allow_timeout_override", False)),
        max_queue_size=int(policy.get("max_queue_size", 0)),
    )


def _parse_batcher(dynamic: dict[str, Any]) -> common.DynamicBatcher:
    default_policy = dynamic.get("default_queue_policy")
    by_priority = dynamic.get("priority_queue_policy")
    preferred = dynamic.get("preferred_batch_size")
    return common.DynamicBatcher(
        preferred_batch_size=[int(size) for size in preferred] if preferred is not None else None,
        max_queue_delay_microseconds=int(dynamic.get("max_queue_delay_microseconds", 0)),
        preserve_ordering=bool(dynamic.get("preserve_ordering", False)),
        priority_levels=int(dynamic.get("priority_levels", 0)),
        default_priority_level=int(dynamic.get("default_priority_level", 0)),
        default_queue_policy=_parse_policy(default_policy) if default_policy else None,
        priority_queue_policy={int(level): _parse_policy(p) for level, p in by_priority.items()}
        if by_priority
        else None,
    )


def _parse_warmup(stage: dict[str, Any]) -> common.ModelWarmup:
    inputs = {}
    for name, spec in stage["inputs"].items():
        shape = tuple(int(d) for d in spec["dims"])
        if not shape:
            raise PyTritonModelConfigError(f"Dimension for {name} not defined.")
        inputs[name] = common.WarmupInput(
            dtype=_parse_dtype(spec["data_type"], name),
            shape=shape,
            random_data=spec.get("random_data", False),
            zero_data=spec.get("zero_data", False),
            input_data_file=spec.get("input_data_file", None),
        )
    return common.ModelWarmup(name=stage["name"], batch_size=stage["batch_size"], inputs=inputs, count=stage["count"])
