"""A bound model as the native backend sees it: its declarations, its runner (chosen once
here, by execution mode) and its life in Triton (loaded copies, finalization).

The attributes and methods the native module reads are listed in
:class:`embedtriton.backend.library.NativeModel`.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import tracing
from ..config import InstanceGroup, ModelConfig, QueuePolicy, Tensor, TimeoutAction
from ..config.triton_json import has_dynamic_batcher, model_config_json
from ..errors import InvalidArgumentError
from ..tensors import BY_NAME, triton_dtype
from ..triton.devices import cuda_devices
from . import aio, runners
from .batch import InferFunc, split_outputs
from .request import DEADLINE_PARAMETER, Request

log = logging.getLogger("embedtriton")

BACKEND_NAME = "embedtriton"  # the backend Triton knows our native module as


# What crosses into the native backend at load, as tuples (named: the C parses them by position).
class OutputSpec(NamedTuple):
    """An output as backend.c read_output_specs reads it."""

    name: str | None  # (a binding's tensors all have names)
    datatype: int  # TRITONSERVER_DataType value
    dims: tuple[int, ...]
    gpu: bool  # the callable returns it in GPU memory


class LevelPolicy(NamedTuple):
    """One priority level's queue policy, as queues.c gate_new reads it."""

    delay: bool  # timeout_action DELAY (else REJECT)
    default_timeout_us: int
    allow_timeout_override: bool
    max_queue_size: int


class QueueGate(NamedTuple):
    """What the backend's queue gate applies (queues.c gate_new)."""

    limit: int  # requests an instance takes at once
    default_level: int  # the default priority level's index
    levels: tuple[LevelPolicy, ...]  # level 1 first


class FastBatch(NamedTuple):
    """A plain ``@batch`` function the backend runs itself (fast_batch.c fast_batch_init)."""

    func: Callable[..., Any]
    takes_parameters: bool
    failed: Callable[..., Any]  # the runner's error message for an exception
    split: Callable[..., Any]  # the Python split of outputs that are not numpy arrays
    declines: tuple[str, str]  # parameters that send a request's batch the general way (span, deadline)


class Binding:
    """A bound model: what the native backend reads at load time and calls per batch."""

    def __init__(
        self,
        name: str,
        infer_func: InferFunc,
        inputs: list[Tensor],
        outputs: list[Tensor],
        config: ModelConfig,
        version: int = 1,
    ) -> None:
        self.name = name
        self.version = version
        self.infer_func = infer_func
        self.inputs = inputs
        self.outputs = outputs
        self.config = config
        self.max_batch_size = config.max_batch_size if config.batching else 0
        # With optional inputs Triton only counts a request's inputs: Model.submit checks the names.
        self.required_inputs = (
            frozenset(t.name for t in inputs if not t.optional) if any(t.optional for t in inputs) else None
        )
        self.decoupled = config.decoupled
        self.batch_rule = config.batch_rule
        self.sequence = config.sequence_batcher is not None
        # A batcher thread of Triton's hands the requests to the instances (read by the backend:
        # how an instance thread lingers after an execute, see linger() in threads.c).
        self.with_batcher = self.sequence or has_dynamic_batcher(config)
        self.iterative = config.sequence_batcher is not None and config.sequence_batcher.iterative
        # (name, TRITONSERVER_DataType value, dims, wants GPU memory) per output, read by the backend.
        self.output_specs = [
            OutputSpec(t.name, BY_NAME[triton_dtype(t.dtype)].value, t.shape, t.device == "gpu") for t in outputs
        ]
        # GPU memory (read by the backend): how GPU inputs reach the callable, which inputs it
        # wants on the GPU even when they arrive in host memory.
        self.gpu_wrap = gpu_wrapper(name, config.gpu_arrays)
        self.gpu_inputs = tuple(t.name for t in inputs if t.device == "gpu")
        self.loaded_at = 0.0  # time.monotonic() when Triton last finished loading it
        # Warm-up (see ModelState.warmup_left in the backend): Triton runs each stage `count`
        # times on each instance before the model serves; a failure is recorded, not sent.
        self.warmup_runs = warmup_runs(config)
        # Queue policies and priorities, kept by the backend in front of Triton's queue (read at
        # load; Triton's config then has none, see triton_config), or None.
        self.queue_gate = queue_gate(config)
        self.warming = False  # True while the server loads this model
        self.warmup_error: str | None = None
        self._alive = 0  # loaded copies of the model in Triton (the backend counts them)
        self._alive_changed = threading.Condition()
        self.runner = self._runner()
        self.execute = self.runner.execute
        self.fast_batch = self._fast_batch()
        if isinstance(self.runner, runners.Iterative):
            self._iterate = self.runner.iterate
            self._knows = self.runner.knows
            self._forget = self.runner.forget

    def _runner(self) -> Any:
        """The runner of this model's execution mode."""
        func, config = self.infer_func, self.config
        if inspect.iscoroutinefunction(func):
            if config.sequence_batcher is not None or config.decoupled:
                raise InvalidArgumentError(
                    f"model '{self.name}': an async def callable answers each request once; for a decoupled "
                    "(streaming) model write an async generator (async def with yield), and sequence "
                    "models take plain callables"
                )
            return runners.Async(self.name, func)
        if config.sequence_batcher is not None:
            if config.sequence_batcher.iterative:
                if inspect.isgeneratorfunction(func):
                    return runners.Iterative(self.name, func)
                return runners.IterativeBatch(self.name, func)
            idle_us = config.sequence_batcher.max_sequence_idle_microseconds
            return runners.Sequence(self.name, func, idle_us, config.decoupled)
        if config.decoupled:
            return runners.Decoupled(self.name, func)
        return runners.Plain(self.name, func)

    def _fast_batch(self) -> FastBatch | None:
        """What the backend needs to run a plain ``@batch`` function itself, straight from
        Triton's buffers (native/_native/fast_batch.c), or None: the function, whether it takes
        ``parameters``, the runner's error message for an exception, the Python split of outputs
        that are not numpy arrays, and the parameters that send a request's batch the general
        way (a traced request's span, a deadline), which reads them."""
        func = getattr(self.infer_func, "batch_function", None)
        if func is None or type(self.runner) is not runners.Plain:
            return None
        takes_parameters = bool(getattr(self.infer_func, "batch_parameters", False))
        declines = (tracing.SPAN_PARAMETER, DEADLINE_PARAMETER)
        return FastBatch(func, takes_parameters, self.runner.failed, split_outputs, declines)

    def schedule(self, coroutine: Any, batch: Any) -> None:
        """The backend hands over an async callable's batch: run it on the library's loop."""
        aio.schedule(coroutine, batch)

    def triton_config(self, library_path: str) -> dict[str, Any]:
        """Triton's config for this model; ``library_path``: the backend library (also the batch strategy).

        Without its queue policies and priority levels, which the backend applies itself
        (``queue_gate``): with them Triton 2.51's dynamic batcher leaves 0.5 s idle gaps.
        """
        config = model_config_json(self.name, self.inputs, self.outputs, self.config, BACKEND_NAME, library_path)
        if self.queue_gate is not None:
            for key in _QUEUE_KEYS:
                config["dynamic_batching"].pop(key, None)
        return config

    def applied_config(self, applied: dict[str, Any]) -> dict[str, Any]:
        """The config Triton applied (``Model.config()``) with the queue policies and priority
        levels the backend applies in Triton's place, as Triton would report them."""
        batching = applied.get("dynamic_batching")
        if self.queue_gate is None or not isinstance(batching, dict):
            return applied
        declared = model_config_json(self.name, self.inputs, self.outputs, self.config, BACKEND_NAME)
        ours = declared["dynamic_batching"]
        batching.update({"priority_levels": 0, "default_priority_level": 0, "priority_queue_policy": {}})
        batching.update({key: ours[key] for key in _QUEUE_KEYS if key in ours})
        return applied

    @property
    def alive(self) -> bool:
        """Whether Triton still holds a loaded copy of the model (not finalized yet)."""
        return self._alive > 0

    def _loaded(self, delta: int) -> None:
        """Called by the backend when Triton initializes (+1) or finalizes (-1) the model."""
        with self._alive_changed:
            self._alive += delta
            self._alive_changed.notify_all()

    def wait_finalized(self, timeout: float, delete_released: Callable[[], Any]) -> bool:
        """Wait until Triton has finalized every loaded copy of the model.

        Triton deletes an unloaded model on a thread of its own once the last request
        referring to it is deleted; ``delete_released`` deletes the requests released meanwhile.
        """
        deadline = time.monotonic() + timeout
        with self._alive_changed:
            while self._alive > 0:
                delete_released()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._alive_changed.wait(min(left, 0.005))
        return True

    def _include(self, batch: list[Request], candidate: Request) -> bool:
        """Called by Triton's batcher: may ``candidate`` join ``batch`` (the requests accepted
        so far into the batch being formed)? A rule that raises lets the request in."""
        try:
            accepted = bool(self.batch_rule(candidate, batch))  # type: ignore[misc]
        except Exception:
            log.exception("batch_rule of model %r raised; the request joins the batch", self.name)
            accepted = True
        if accepted:
            batch.append(candidate)
        return accepted


_QUEUE_KEYS = ("priority_levels", "default_priority_level", "default_queue_policy", "priority_queue_policy")


def queue_gate(config: ModelConfig) -> QueueGate | None:
    """What the backend's queue gate applies (``embedtriton/native/_native/queues.c``): the
    requests an instance takes at once, the default priority level's index, and per level (1
    first) its policy as (delay, default timeout µs, allow override, max queue size). None when
    Triton would prefetch anyway: no priority levels and a default policy without a timeout,
    override or size limit (Triton 2.51 stalls only otherwise)."""
    batcher = config.batcher
    default = batcher.default_queue_policy or QueuePolicy()
    if config.sequence_batcher is not None or not (
        batcher.priority_levels
        or default.default_timeout_microseconds
        or default.allow_timeout_override
        or default.max_queue_size
    ):
        return None
    levels = max(1, batcher.priority_levels)
    policies = tuple(
        LevelPolicy(
            policy.timeout_action is TimeoutAction.DELAY,
            policy.default_timeout_microseconds,
            policy.allow_timeout_override,
            policy.max_queue_size,
        )
        for policy in ((batcher.priority_queue_policy or {}).get(level, default) for level in range(1, levels + 1))
    )
    default_level = (batcher.default_priority_level or batcher.priority_levels or 1) - 1
    preferred = batcher.preferred_batch_size
    limit = max(preferred) if preferred else max(1, config.max_batch_size if config.batching else 1)
    return QueueGate(limit, default_level, policies)


def warmup_runs(config: ModelConfig) -> int:
    """How many times Triton executes warm-up requests, over all instances, when it loads a
    model with ``config`` (one execution per stage and iteration, on every instance)."""
    runs = sum(stage.count for stage in config.model_warmup or [] if stage.batch_size > 0)
    if not runs:
        return 0
    instances = 0
    for group in config.instance_group or [InstanceGroup()]:
        devices = len(group.gpus) if group.gpus else cuda_devices()[0] if group.kind == "GPU" else 1
        instances += group.count * devices
    return runs * instances


def gpu_wrapper(model: str, kind: str) -> Callable[[Any], Any] | None:
    """What turns a GPU input (a DeviceArray, DLPack) into the array the callable gets: cupy's or
    torch's from_dlpack (imported at the first GPU input), or None to hand the DeviceArray over."""
    if kind == "dlpack":
        return None
    convert: list[Callable[[Any], Any]] = []

    def wrap(array: Any) -> Any:
        if not convert:
            try:
                module = importlib.import_module(kind)
            except ImportError:
                package = "cupy-cuda12x" if kind == "cupy" else "torch"
                raise ImportError(
                    f"model '{model}' got an input in GPU memory and ModelConfig(gpu_arrays={kind!r}) hands "
                    f"it over as a {kind} array, but {kind} is not installed: pip install {package}, or "
                    "choose gpu_arrays='torch', 'cupy' or 'dlpack' (any library's from_dlpack)"
                ) from None
            convert.append(module.from_dlpack)
        return convert[0](array)

    return wrap
