"""A handle on one model of a server; every request of every caller goes through
:meth:`Model.submit` into the native data path."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..backend import library
from ..backend.request import DEADLINE_PARAMETER, deadline, deadlines
from ..errors import SERVER_STOPPING, InvalidArgumentError, NotFoundError, TritonError, UnavailableError
from ..triton import control
from .fixits import explain_inputs
from .handles import Cancel, Stream
from .queues import queue_stats, with_queue_in_statistics
from .request import SEQUENCE_END, InferRequest, RequestOptions, timeout_of, with_deadline
from .streams import iterate, iterate_async

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..backend.binding import Binding
    from ..tracing import Tracer
    from .repositories import LoadedModel


def _as_dict(inputs: Any) -> dict[str, Any]:
    if not isinstance(inputs, Mapping):
        raise InvalidArgumentError(
            f"each item of infer_many()'s inputs must be a mapping of input name -> array, not {type(inputs).__name__}"
        )
    return dict(inputs)


class ModelHost(Protocol):
    """What a :class:`Model` reads of its server (``CoreServer``)."""

    _handle: int | None
    _bound: dict[str, Binding]
    _repository_models: dict[str, LoadedModel]
    _stopping: bool
    _tracer: Tracer | None

    def _require_handle(self) -> int: ...


class Model:
    """A handle on one model of a :class:`Server`.

    Every call takes the per-request options of :class:`RequestOptions` as keywords:
    ``parameters``, ``priority``, ``timeout_us``, ``request_id``, ``outputs``, and for
    stateful models ``correlation_id`` (a positive int or a str) with ``sequence_start`` /
    ``sequence_end`` marking the first and last request, and ``output_device``.
    """

    def __init__(self, server: ModelHost, name: str, version: int = -1) -> None:
        self._server = server
        self.name = name
        self.version = version

    def __repr__(self) -> str:
        return f"Model({self.name!r})"

    def infer(self, inputs: Mapping[str, Any], **options: Unpack[RequestOptions]) -> dict[str, Any]:
        """Run one request and return its outputs (name -> numpy array).

        ``inputs`` maps input names to arrays (with the batch axis when the model batches).
        ``outputs`` limits which outputs come back (all by default).
        """
        server, binding = self._server, None
        try:
            if options or type(inputs) is not dict or server._tracer is not None or deadlines.used:
                return self.submit(InferRequest.from_options(inputs, options))
            # No options, no tracing, no deadline anywhere: the inputs dict goes to the native
            # submit as it is (read as a request with only inputs: no InferRequest), past the
            # checks of _admit and _check_required, taken in full when any of them could refuse.
            binding = server._bound.get(self.name)
            if server._stopping or binding is None or binding.decoupled or getattr(binding, "required_inputs", None):
                binding = self._admit(None, False)
                self._check_required(binding, inputs)
            return (library._native or library.native()).submit(
                server._handle, self.name, self.version, inputs, None, None, False, False,
                binding is not None and binding.batch_rule is not None,
            )  # fmt: skip
        except InvalidArgumentError as exc:
            raise self._explained(inputs, exc) from None
        except (NotFoundError, UnavailableError) as exc:
            if not hasattr(binding, "step_models"):  # (submit() named an ensemble's step already)
                raise
            raise self._ensemble_error(binding, exc) from None  # an ensemble: name the step that is down

    def infer_async(
        self, inputs: Mapping[str, Any], **options: Unpack[RequestOptions]
    ) -> asyncio.Future[dict[str, Any]]:
        """:meth:`infer` for asyncio: ``await model.infer_async(...)``; many may be in flight.

        Must be called from a running event loop. Returns an asyncio future (no coroutine
        per request); errors, including bad inputs, are raised where it is awaited.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        try:
            self.submit(InferRequest.from_options(inputs, options), loop, future)
        except InvalidArgumentError as exc:
            future.set_exception(self._explained(inputs, exc))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def stream(self, inputs: Mapping[str, Any], **options: Unpack[RequestOptions]) -> Iterator[dict[str, Any]]:
        """Run one request on a decoupled model and iterate over its responses as they come.

        An error (the model raised mid-stream) is raised after the responses sent before
        it. Leaving the loop early (``break``, an exception, closing the iterator) cancels
        the request and closes the model's generator.
        """
        try:
            return iterate(self.submit(InferRequest.from_options(inputs, options), stream=True))
        except InvalidArgumentError as exc:
            raise self._explained(inputs, exc) from None

    async def stream_async(
        self, inputs: Mapping[str, Any], **options: Unpack[RequestOptions]
    ) -> AsyncIterator[dict[str, Any]]:
        """:meth:`stream` for asyncio: ``async for part in model.stream_async(...)``."""
        request = InferRequest.from_options(inputs, options)
        arrived = asyncio.Event()
        try:
            handle = self.submit(request, asyncio.get_running_loop(), arrived.set, True)
        except InvalidArgumentError as exc:
            raise self._explained(inputs, exc) from None
        responses = iterate_async(handle, arrived)
        try:
            async for outputs in responses:
                yield outputs
        finally:
            await responses.aclose()  # closes the stream now, not when collected

    def submit(
        self,
        request: InferRequest,
        loop: Any = None,
        target: Any = None,
        stream: bool = False,
        cancellable: bool = False,
    ) -> Any:
        """Hand one request to the native data path (it validates inputs and options); the
        entry of every caller, in process and over the network.

        Without a loop or target: waits and returns the outputs. With a loop (an asyncio
        loop, or any object with ``call_soon_threadsafe``): resolves ``target`` (a future-like
        object) there. Without a loop, with a target: calls ``target(outputs, None)`` or
        ``target(None, error)`` once, on the thread that completes the call (with the GIL),
        and returns at once. ``stream``: returns a :class:`~.handles.Stream`; ``target``
        wakes its consumer (on its loop, or called there without one). ``cancellable``
        (with a loop or a target): returns a :class:`~.handles.Cancel`.
        """
        server = self._server
        binding = self._admit(request, stream)
        self._check_required(binding, request.inputs)
        # With a batch rule, Triton's batcher calls Python: hand requests over without the GIL.
        release_gil = binding is not None and binding.batch_rule is not None
        native = library._native or library.native()
        tracer, span, traced = server._tracer, None, None
        try:
            if tracer is not None:
                parent = request.trace_parent
                span, sink, traced = tracer.begin(
                    self.name, self.version, request.inputs, request.request_id, request.parameters, parent,
                    parent is not None,
                )  # fmt: skip
                if span is not None:
                    request = request.traced(traced, sink)
            result = native.submit(
                server._handle, self.name, self.version, request, loop, target, stream, cancellable, release_gil
            )
        except Exception as exc:
            if span is not None and tracer is not None:
                tracer.abandon(span, traced, exc)
            if not isinstance(exc, (NotFoundError, UnavailableError)) or not hasattr(binding, "step_models"):
                raise
            raise self._ensemble_error(binding, exc) from None  # an ensemble: name the step that is down
        if stream:
            return Stream(result)
        if cancellable and result is not None and (loop is not None or target is not None):
            return Cancel(result)
        return result

    def infer_many(
        self,
        inputs: Iterable[Mapping[str, Any]],
        *,
        max_in_flight: int = 64,
        return_exceptions: bool = False,
        **options: Unpack[RequestOptions],
    ) -> list[Any]:
        """Run many requests from one call (offline scoring); their outputs, in order.

        Up to ``max_in_flight`` requests are in Triton's hands at once: the caller waits (GIL
        released) until half of them are done, takes their outputs and hands over more, so it
        wakes once per ``max_in_flight / 2`` requests, not once per request. The options apply
        to every request (``request_id`` and sequences, which are per request, are not taken).
        A failed request fails alone: with ``return_exceptions=True`` its exception takes its
        place in the list; otherwise the first one is raised once every request has finished.
        """
        request = InferRequest.from_options({}, options)
        if request.request_id is not None or request.sequence is not None:
            raise InvalidArgumentError(
                "infer_many() takes no request_id or correlation_id (they are per request): call infer() for those"
            )
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or not 1 <= max_in_flight <= 65536:
            raise InvalidArgumentError(f"max_in_flight must be an int from 1 to 65536, not {max_in_flight!r}")
        # One list of the right size, made once: a list built item by item is reallocated some
        # 40 times for 1,024 requests, and each time glibc first consolidates the small chunks
        # Triton freed since the last (perf, batching off: 3.7 % of the process's CPU, all of it
        # under the GIL; one list() leaves 1.1 %).
        items = list(inputs)
        for i, x in enumerate(items):
            if type(x) is not dict:
                items[i] = _as_dict(x)
        binding = self._admit(request, False)
        self._check_required(binding, *items)
        server, native = self._server, library._native or library.native()
        parameters, sinks, spans = None, None, None
        tracer = server._tracer
        if tracer is not None:
            begun = [tracer.begin(self.name, self.version, x, None, request.parameters) for x in items]
            spans = [(span, traced) for span, _, traced in begun]
            sinks = [sink for _, sink, _ in begun]
            parameters = [traced for _, _, traced in begun]  # (None: the shared parameters)
        results = native.submit_many(
            server._handle, self.name, self.version, request, items, parameters, sinks, max_in_flight,
            binding is not None and binding.batch_rule is not None,
        )  # fmt: skip
        first = None
        for i, result in enumerate(results):
            if isinstance(result, BaseException):
                if tracer is not None and spans is not None:
                    tracer.abandon(spans[i][0], spans[i][1], result)  # (ends it only if Triton never saw it)
                if isinstance(result, InvalidArgumentError):
                    results[i] = result = self._explained(items[i], result)
                first = result if first is None else first
        if first is not None and not return_exceptions:
            raise first
        return results

    def _admit(self, request: InferRequest | None, stream: bool) -> Binding | None:
        """The checks every request passes before the native path; the model's binding.
        (request None: one without options, while no request has carried a deadline.)"""
        server = self._server
        if server._stopping and not (library._native or library.native()).in_model():  # see CoreServer.stop
            raise UnavailableError(SERVER_STOPPING)
        binding = server._bound.get(self.name)
        if not stream and (binding.decoupled if binding is not None else self.decoupled):
            raise InvalidArgumentError(f"model '{self.name}' is decoupled: call stream() or stream_async()")
        if request is not None and (request.timeout_us is not None or deadlines.used):
            self._with_deadline(request)
        if request is not None and request.sequence is not None and getattr(binding, "iterative", False):
            # Each request of an iterative model is a whole sequence: its slot is held until its
            # final release (Triton 2.51, IterativeSequencer::RescheduleRequest). With END set the
            # sequence batcher frees the slot after the first iteration, and the rescheduled
            # request, no longer START, is refused where nobody hears it: its caller waited forever.
            correlation_id, flags = request.sequence
            request.sequence = (correlation_id, flags & ~SEQUENCE_END)
        return binding

    def _check_required(self, binding: Binding | None, *each_inputs: Any) -> None:
        """Refuse inputs (one request's, or each of many requests') that leave out a required input."""
        required = getattr(binding, "required_inputs", None)  # (set only when some inputs are optional)
        if required is None:
            return
        for inputs in each_inputs:
            if hasattr(inputs, "keys") and not required <= inputs.keys():
                raise InvalidArgumentError(
                    f"model '{self.name}': missing required input(s) {sorted(required - inputs.keys())} "
                    f"(got {sorted(inputs.keys())}); only inputs declared optional may be left out"
                )

    def _with_deadline(self, request: InferRequest) -> None:
        """A model-to-model call without its own timeout gets what is left of the calling
        request's; a request with a timeout carries its deadline to the model's callable."""
        now = time.monotonic_ns()
        timeout = timeout_of(request.timeout_us)  # (a wrong one is refused, a numpy integer taken)
        if not timeout:  # (0: no timeout, as in Triton)
            ends = deadline.get()
            if ends is None:
                return
            if ends <= now:
                raise UnavailableError(f"the calling request's timeout expired before it called model '{self.name}'")
            timeout = max(1, (ends - now) // 1000)
        request.timeout_us = timeout
        deadlines.used = True
        request.parameters = with_deadline(request.parameters, now + timeout * 1000, DEADLINE_PARAMETER)

    def _ensemble_error(self, ensemble: Any, error: TritonError) -> TritonError:
        """Triton's "no available versions" for an ensemble, with the step models that are down."""
        server = self._server
        down = sorted(n for n in ensemble.step_models if not Model(server, n).ready)
        if not down:
            return error
        return UnavailableError(
            f"ensemble '{self.name}' is unavailable: its step model {down} is not loaded "
            f"(load it again: server.load({down[0]!r}))"
        )

    def _explained(self, inputs: Mapping[str, Any], error: InvalidArgumentError) -> InvalidArgumentError:
        """Triton's refusal of a Python caller's inputs, retold in numpy terms."""
        return explain_inputs(self.name, self._server._bound.get(self.name), inputs, error)

    @property
    def decoupled(self) -> bool:
        """Whether the model is decoupled (answered by :meth:`stream`, not :meth:`infer`): as
        bound, or for a repository's Triton model as Triton loaded it."""
        binding = self._server._bound.get(self.name)
        if binding is not None:
            return binding.decoupled
        loaded = self._server._repository_models.get(self.name)
        return loaded is not None and loaded.decoupled

    @property
    def batched(self) -> bool:
        """Whether the model's tensors have a batch axis first (``max_batch_size`` > 0)."""
        binding = self._server._bound.get(self.name)
        if binding is not None:
            return binding.config.batching
        loaded = self._server._repository_models.get(self.name)
        return loaded is not None and loaded.max_batch_size > 0

    def labels(self, output: str) -> tuple[str, ...] | None:
        """The class labels declared for ``output`` (``Tensor(labels=...)``), if any."""
        binding = self._server._bound.get(self.name)
        for tensor in binding.outputs if binding is not None else ():
            if tensor.name == output:
                return tensor.labels
        return None

    @property
    def ready(self) -> bool:
        """Whether Triton reports the model READY."""
        handle = self._server._handle
        if handle is None:
            return False
        try:
            return control.model_is_ready(handle, self.name, self.version)
        except TritonError:
            return False

    def metadata(self) -> dict[str, Any]:
        """Triton's model metadata (inputs, outputs, versions, platform)."""
        return control.model_metadata(self._server._require_handle(), self.name, self.version)

    def config(self) -> dict[str, Any]:
        """The model configuration that Triton applied."""
        config = control.model_config(self._server._require_handle(), self.name, self.version)
        applied = getattr(self._server._bound.get(self.name), "applied_config", None)  # queue policies
        return applied(config) if applied is not None else config

    def statistics(self) -> dict[str, Any]:
        """Triton's statistics for this model (inference/execution counts, timings, batch stats)."""
        stats = control.model_statistics(self._server._require_handle(), self.name, self.version)
        entries = stats.get("model_stats", [])
        if not entries:
            raise NotFoundError(f"no statistics for model '{self.name}'")
        return with_queue_in_statistics(entries[0], queue_stats(self._server._require_handle()))
