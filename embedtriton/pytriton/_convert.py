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
    """Triton's model config JSON (``get_model_config``) as a TritonModelConfig."""

    def spec(item: dict[str, Any], what: str) -> TensorSpec:
        data_type = str(item.get("data_type", "")).removeprefix("TYPE_")
        data_type = "BYTES" if data_type == "STRING" else data_type
        found = BY_NAME.get(data_type)
        if found is None or (found.numpy is None and found.name != "BYTES"):
            raise PyTritonModelConfigError(f"{what} '{item.get('name')}' has a data type numpy lacks: {data_type}")
        dtype = np.bytes_ if found.name == "BYTES" else found.numpy.type  # type: ignore[union-attr]
        return TensorSpec(item["name"], tuple(int(d) for d in item.get("dims", [])), dtype, item.get("optional", False))

    dynamic = config.get("dynamic_batching")
    batcher = None
    if dynamic is not None:
        batcher = common.DynamicBatcher(
            max_queue_delay_microseconds=int(dynamic.get("max_queue_delay_microseconds", 0)),
            preferred_batch_size=[int(s) for s in dynamic["preferred_batch_size"]]
            if dynamic.get("preferred_batch_size")
            else None,
            preserve_ordering=bool(dynamic.get("preserve_ordering", False)),
            priority_levels=int(dynamic.get("priority_levels", 0)),
            default_priority_level=int(dynamic.get("default_priority_level", 0)),
        )
    groups: dict[common.DeviceKind, int | None] = {}
    for group in config.get("instance_group", []):
        try:
            groups[common.DeviceKind(group.get("kind", "KIND_AUTO"))] = group.get("count")
        except ValueError:
            continue
    max_batch_size = int(config.get("max_batch_size", 0))
    return TritonModelConfig(
        model_name=config["name"],
        max_batch_size=max_batch_size,
        batching=max_batch_size > 0,
        batcher=batcher,
        instance_group=groups,
        decoupled=bool(config.get("model_transaction_policy", {}).get("decoupled", False)),
        inputs=[spec(i, "input") for i in config.get("input", [])] or None,
        outputs=[spec(o, "output") for o in config.get("output", [])] or None,
        response_cache=ResponseCache(enable=True) if config.get("response_cache", {}).get("enable") else None,
    )
