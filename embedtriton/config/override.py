"""A Triton model configuration read back into a :class:`~embedtriton.ModelConfig` for a bound
model: sent over the network (RepositoryModelLoad's ``config`` parameter, JSON) or written next
to a repository's ``model.py`` (``config.pbtxt``, protobuf text). Needs tritonclient's
generated ``model_config_pb2`` (the ``[grpc]`` extra), imported when first used.

The JSON is Triton's ``ModelConfig`` message, parsed as Triton parses it (protobuf JSON: a
misspelt field is an error). A bound model keeps its callable and its tensors, so the override
may change how Triton serves it (batch size, batchers, instances, cache, warm-up, decoupled)
but not what it computes: inputs and outputs, when given, must be the bound ones. What
``get_model_config`` returns is accepted as it is, so a client can fetch the config, change a
field and load it back.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidArgumentError, UnsupportedError
from .model import (
    DynamicBatcher,
    InstanceGroup,
    ModelConfig,
    QueuePolicy,
    SequenceBatcher,
    TimeoutAction,
    VersionPolicy,
)
from .tensor import Tensor
from .triton_json import model_config_json


def _protobuf() -> tuple[Any, Any, Any]:
    """(json_format, text_format, model_config_pb2), imported when first needed."""
    try:
        from google.protobuf import json_format, text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError as exc:
        raise UnsupportedError(
            'reading Triton model configs needs tritonclient: pip install "embedtriton[grpc]"'
        ) from exc
    return json_format, text_format, model_config_pb2


MAX_INSTANCES = 64  # model instances a network client may ask for

# Fields that do not change how a bound model is served, accepted as get_model_config returns
# them (Triton fills them in); anything else must be one of the fields read below.
_ACCEPTED = {"name", "backend", "input", "output", "optimization", "version_policy"}
_READ = {
    "max_batch_size", "instance_group", "dynamic_batching", "sequence_batching", "response_cache",
    "model_transaction_policy", "model_warmup", "parameters",
}  # fmt: skip


def parse_pbtxt(
    text: str, source: str, name: str, inputs: list[Tensor], outputs: list[Tensor], current: ModelConfig
) -> ModelConfig:
    """A ``config.pbtxt`` beside a repository model.py: overrides the ModelConfig it declares."""
    json_format, text_format, pb = _protobuf()
    try:
        message = text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as exc:
        raise InvalidArgumentError(f"{source}: {exc}") from None
    return parse_override(json_format.MessageToJson(message), name, inputs, outputs, current, network=False)


def parse_override(
    text: str, name: str, inputs: list[Tensor], outputs: list[Tensor], current: ModelConfig, network: bool = True
) -> ModelConfig:
    """The ModelConfig that a config override asks for, checked against the bound model
    (``network``: sent by a client, who may not change the warm-up or ask for many instances)."""
    global _pb
    json_format, _, pb = _protobuf()
    _pb = pb  # (for the helpers below)
    try:
        message = json_format.Parse(text, pb.ModelConfig())
    except (json_format.ParseError, json.JSONDecodeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"failed to load '{name}': the config parameter is not a model config: {exc}"
        ) from None
    fields = {field.name for field, _ in message.ListFields()}
    unsupported = sorted(fields - _ACCEPTED - _READ)
    if unsupported:
        raise InvalidArgumentError(
            f"failed to load '{name}': config fields {unsupported} cannot be set on a bound model "
            f"(it takes: {sorted(_READ)})"
        )
    if message.name and message.name != name:
        raise InvalidArgumentError(f"failed to load '{name}': the config names model '{message.name}'")
    if message.backend and message.backend != "embedtriton":
        raise InvalidArgumentError(
            f"failed to load '{name}': a bound model runs on backend 'embedtriton', not '{message.backend}'"
        )
    expected = model_config_json(name, inputs, outputs, current, "embedtriton")
    for what, declared in (("input", expected["input"]), ("output", expected["output"])):
        given = getattr(message, what)
        if given and _tensors(given) != _tensors(declared):
            raise InvalidArgumentError(
                f"failed to load '{name}': the config's {what}s must be the bound ones "
                f"{sorted(_tensors(declared))}: the callable stays the same"
            )
    parameters = dict(message.parameters)
    if set(parameters) - {"TRITON_BATCH_STRATEGY_PATH"}:
        raise InvalidArgumentError(f"failed to load '{name}': a bound model takes no config parameters")
    batching = message.max_batch_size > 0
    sequence = _sequence(message.sequence_batching) if message.HasField("sequence_batching") else None
    keep_rule = batching and sequence is None
    if not network and message.model_warmup:
        raise InvalidArgumentError(
            f"model '{name}': a config.pbtxt beside model.py cannot declare model_warmup; declare it in "
            "model.py: config = ModelConfig(model_warmup=[...])"
        )
    bound_warmup = [json_format.ParseDict(w, pb.ModelWarmup()) for w in expected.get("model_warmup", [])]
    if network and list(message.model_warmup) not in ([], bound_warmup):
        # Warm-up data runs through the callable at load (and file-based warm-ups name files):
        # the application chooses it, not a network client.
        raise InvalidArgumentError(
            f"failed to load '{name}': model_warmup cannot be changed over the network; "
            "bind the model with ModelConfig(model_warmup=...) in the application"
        )
    instances = sum(g.count or 1 for g in message.instance_group)
    if network and instances > MAX_INSTANCES:  # each instance is a Triton thread running the callable
        raise InvalidArgumentError(
            f"failed to load '{name}': {instances} model instances asked over the network; at most "
            f"{MAX_INSTANCES} (more: bind the model with ModelConfig(instance_group=...) in the application)"
        )
    return ModelConfig(
        batching=batching,
        max_batch_size=message.max_batch_size if batching else current.max_batch_size,
        batcher=_dynamic(message.dynamic_batching) if message.HasField("dynamic_batching") else DynamicBatcher(),
        response_cache=message.response_cache.enable,
        decoupled=message.model_transaction_policy.decoupled,
        model_warmup=current.model_warmup,
        version_policy=_version_policy(message.version_policy)
        if message.HasField("version_policy")
        else current.version_policy,
        instance_group=[_group(g) for g in message.instance_group] or None,
        sequence_batcher=sequence,
        batch_rule=current.batch_rule if keep_rule else None,
    )


def _tensors(tensors: Any) -> set[tuple[str, str, tuple[int, ...]]]:
    if tensors and isinstance(tensors[0], dict):
        return {(t["name"], t["data_type"], tuple(t["dims"])) for t in tensors}
    return {(t.name, _pb.DataType.Name(t.data_type), tuple(t.dims)) for t in tensors}


def _group(group: Any) -> InstanceGroup:
    kind = _pb.ModelInstanceGroup.Kind.Name(group.kind).removeprefix("KIND_")
    if kind == "AUTO":
        kind = "GPU" if group.gpus else "CPU"
    return InstanceGroup(count=group.count or 1, kind=kind, gpus=list(group.gpus) or None)


def _policy(policy: Any) -> QueuePolicy:
    return QueuePolicy(
        timeout_action=TimeoutAction(_pb.ModelQueuePolicy.TimeoutAction.Name(policy.timeout_action)),
        default_timeout_microseconds=policy.default_timeout_microseconds,
        allow_timeout_override=policy.allow_timeout_override,
        max_queue_size=policy.max_queue_size,
    )


def _dynamic(batcher: Any) -> DynamicBatcher:
    return DynamicBatcher(
        max_queue_delay_microseconds=batcher.max_queue_delay_microseconds,
        preferred_batch_size=list(batcher.preferred_batch_size) or None,
        preserve_ordering=batcher.preserve_ordering,
        priority_levels=batcher.priority_levels,
        default_priority_level=batcher.default_priority_level,
        default_queue_policy=_policy(batcher.default_queue_policy)
        if batcher.HasField("default_queue_policy")
        else None,
        priority_queue_policy={level: _policy(p) for level, p in sorted(batcher.priority_queue_policy.items())} or None,
    )


def _sequence(batcher: Any) -> SequenceBatcher:
    oldest = batcher.WhichOneof("strategy_choice") == "oldest"
    return SequenceBatcher(
        strategy="oldest" if oldest else "direct",
        max_sequence_idle_microseconds=batcher.max_sequence_idle_microseconds or 1_000_000,
        max_candidate_sequences=batcher.oldest.max_candidate_sequences or None if oldest else None,
        preferred_batch_size=list(batcher.oldest.preferred_batch_size) or None if oldest else None,
        max_queue_delay_microseconds=batcher.oldest.max_queue_delay_microseconds if oldest else 0,
        iterative=batcher.iterative_sequence,
    )


_pb: Any = None  # model_config_pb2, once imported


def _version_policy(policy: Any) -> VersionPolicy:
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return VersionPolicy.all()
    if which == "specific":
        return VersionPolicy.specific(*policy.specific.versions)
    return VersionPolicy.latest(policy.latest.num_versions or 1)
