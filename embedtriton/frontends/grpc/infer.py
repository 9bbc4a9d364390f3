"""ModelInfer and ModelStreamInfer: protobuf in, the core's request object through
:meth:`Model.submit`, protobuf out. Completions are encoded and sent from the thread that
completes them (Triton's), with no event-loop hop: a reply is submitted with a target and
no loop, which the core calls with ``(outputs, error)`` there. KServe semantics come from
:mod:`embedtriton.frontends.kserve`."""

from __future__ import annotations

import logging
import struct
import threading
import weakref
from typing import Any

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from ...core import CoreServer
from ...core.handles import STREAM_EMPTY, STREAM_END, STREAM_ITEM, Cancel, grpc_model_infer
from ...errors import SERVER_STOPPING, InvalidArgumentError, TritonError, UnavailableError, UnsupportedError
from .. import c_path, kserve
from ..security import forwarded
from ..shared_memory import SharedMemory
from .options import GrpcOptions
from .transport import OK, UNAVAILABLE, Call, code_of

log = logging.getLogger("embedtriton")


def parameter(value: Any) -> Any:
    """A protobuf InferParameter's value."""
    which = value.WhichOneof("parameter_choice")
    return getattr(value, which) if which else None


def _tensor_parameters(tensor: Any) -> dict[str, Any]:
    params = tensor.parameters
    return {k: parameter(v) for k, v in params.items()} if params else {}


InFlight = Cancel  # ``call.user`` of a unary ModelInfer handed to Triton: cancelled if the client leaves


class Stream:
    """One ModelStreamInfer call: requests run as they arrive; the call ends once the
    client has half-closed (or the server drains) and every request has finished."""

    def __init__(self, call: Call, headers: dict[str, str] | None = None) -> None:
        self.call = call
        self.headers = headers  # metadata forwarded as parameters to each of its requests
        self.lock = threading.Lock()
        self.pending = 0
        self.half_closed = False
        self.draining = False
        self.cancelled = False
        self.handles: set[Any] = set()  # the core handles of its requests in flight, to cancel them

    @staticmethod
    def final_flag(request: Any) -> bool:
        p = request.parameters.get(kserve.EMPTY_FINAL_RESPONSE)
        return bool(p is not None and parameter(p))

    def send(self, message: Any) -> None:
        if not self.cancelled:
            self.call.send(message.SerializeToString())

    def begin_one(self) -> None:
        with self.lock:
            self.pending += 1

    def done_one(self) -> None:
        with self.lock:
            self.pending -= 1
            finished = (self.half_closed or self.draining) and self.pending == 0
        if finished:
            self._end()

    def close(self) -> None:
        with self.lock:
            self.half_closed = True
            finished = self.pending == 0
        if finished:
            self._end()

    def drain(self) -> None:
        """The server stops: end the stream once its requests in flight have answered."""
        with self.lock:
            self.draining = True
            finished = self.pending == 0
        if finished:
            self._end()

    def cancel(self) -> None:
        """The client went away: cancel its requests in flight."""
        self.cancelled = True
        for handle in list(self.handles):
            if type(handle) is InFlight:
                handle.cancel()
            else:  # a decoupled request's stream
                handle.close()

    def _end(self) -> None:
        if self.half_closed:
            self.call.finish(OK)
        else:
            self.call.finish(UNAVAILABLE, SERVER_STOPPING)


def encode(request: Any, outputs: dict[str, Any], decoded: kserve.Decoded | None = None) -> Any:
    """A ModelInferResponse for ``request`` with ``outputs`` (those in ``decoded.in_shm`` are
    already written into the client's shared memory; those in ``decoded.classify`` go out as
    their top classes)."""
    response = service_pb2.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version or "1", id=request.id
    )
    add, contents = response.outputs.add, response.raw_output_contents
    in_shm = decoded.in_shm if decoded is not None else ()
    classify = decoded.classify if decoded is not None else None
    for name, array in outputs.items():
        datatype = kserve.output_datatype(array)
        if classify and name in classify:
            model = decoded.model  # type: ignore[union-attr]
            array = kserve.classify(array, datatype, classify[name], model.batched, model.labels(name))
            datatype = "BYTES"
        tensor = add(name=name, datatype=datatype, shape=array.shape)
        if name in in_shm:  # BYTES were written in Triton's length-prefixed layout: that many bytes
            size = len(kserve.output_bytes(array, datatype)) if datatype == "BYTES" else array.nbytes
            tensor.parameters["shared_memory_byte_size"].int64_param = size
            contents.append(b"")
        else:
            contents.append(kserve.output_bytes(array, datatype))
    return response


class Reply:
    """The target of one ModelInfer (or one non-decoupled request of a stream): called once
    with ``(outputs, None)`` or ``(None, error)`` on the thread that completes it."""

    __slots__ = ("call", "request", "decoded", "stream", "handle", "finished")

    def __init__(self, call: Call, request: Any, decoded: kserve.Decoded, stream: Stream | None) -> None:
        self.call, self.request, self.decoded, self.stream = call, request, decoded, stream
        self.handle: Any = None  # its cancel handle (requests of a stream)
        self.finished = False

    def __call__(self, outputs: dict[str, Any] | None, error: BaseException | None) -> None:
        if error is None:
            self.set_result(outputs)  # type: ignore[arg-type]
        else:
            self.set_exception(error)

    def set_result(self, outputs: dict[str, Any]) -> None:
        try:
            self.decoded.check_regions()  # a region shrunk under the request: its data is lost
            response = encode(self.request, outputs, self.decoded)
        except Exception as exc:
            self.set_exception(exc)
            return
        if self.stream is None:
            self.call.send(response.SerializeToString())
            self.call.finish(OK)
        else:
            if self.stream.final_flag(self.request):
                response.parameters["triton_final_response"].bool_param = True
            self.stream.send(service_pb2.ModelStreamInferResponse(infer_response=response))
            self._stream_done()

    def set_exception(self, exc: BaseException) -> None:
        if self.stream is None:
            self.call.finish(code_of(exc), str(exc))
        else:
            self.stream.send(service_pb2.ModelStreamInferResponse(error_message=str(exc)))
            self._stream_done()

    def _stream_done(self) -> None:
        assert self.stream is not None
        self.finished = True
        self.stream.handles.discard(self.handle)
        self.stream.done_one()


class Inference:
    """ModelInfer and ModelStreamInfer for one server."""

    def __init__(self, server: CoreServer, shm: SharedMemory, options: GrpcOptions) -> None:
        self.server = server
        self.shm = shm
        self.forward = options.forward  # --grpc-header-forward-pattern, compiled
        # the options for which the C path declines every call (frontends/c_path.py)
        self.declined_options = c_path.options_declining(options, c_path.GRPC_OPTIONS)
        self.draining = False
        self._streams: weakref.WeakSet[Stream] = weakref.WeakSet()  # ModelStreamInfer calls, to drain
        self._streams_lock = threading.Lock()
        # (model_name, model_version) -> (binding, version or None): the models the C path may take
        self._in_c: dict[tuple[str, str], tuple[Any, int | None]] = {}

    def drain(self) -> None:
        """Refuse new requests; streams end once their requests in flight have answered."""
        self.draining = True
        with self._streams_lock:
            streams = list(self._streams)
        for stream in streams:
            stream.drain()

    def forwarded(self, call: Call) -> dict[str, str] | None:
        """The call's metadata that the forward pattern turns into request parameters."""
        if self.forward is None:
            return None
        return forwarded(self.forward, call.metadata, grpc=True) or None

    def decode(self, request: Any, headers: dict[str, str] | None = None) -> kserve.Decoded:
        """A ModelInferRequest, checked, as the core's request object; ``headers``: forwarded
        metadata, string parameters set after (so over) the request's own, as Triton sets them.

        Every size is checked against the bytes actually received before anything is
        allocated; a client's mistake is an InvalidArgumentError for that request only.
        """
        if self.draining:
            raise UnavailableError(SERVER_STOPPING)
        decoded = kserve.Decoded(kserve.model_of(self.server, request.model_name, request.model_version))
        raw = request.raw_input_contents
        inputs = decoded.request.inputs = {}
        used = 0  # raw contents go, in order, to the inputs without shared memory or typed contents
        try:
            for tensor in request.inputs:
                if tensor.name in inputs:  # Triton's words, without its "[request id: ...]" prefix
                    raise InvalidArgumentError(f"input '{tensor.name}' already exists in request")
                inputs[tensor.name], took = self._input_array(request, tensor, raw, used, decoded)
                used += took
            params = {k: parameter(v) for k, v in request.parameters.items()} if request.parameters else {}
            if request.outputs:
                outputs = [(o.name, _tensor_parameters(o)) for o in request.outputs]
                kserve.requested_outputs(decoded, self.shm, outputs)
        except TritonError:
            raise
        except (ValueError, TypeError, OverflowError, struct.error) as exc:  # malformed values: the client's
            raise InvalidArgumentError(f"malformed ModelInferRequest: {exc}") from None
        kserve.apply_parameters(decoded, params, request.id)
        if headers:
            decoded.request.parameters = {**(decoded.request.parameters or {}), **headers}
        return decoded

    def _input_array(self, request: Any, tensor: Any, raw: Any, used: int, decoded: kserve.Decoded) -> tuple[Any, int]:
        """One input's array, and how many raw contents it took (as Triton reads them)."""
        name, shape, datatype = tensor.name, tuple(tensor.shape), tensor.datatype
        kserve.check_shape(name, shape)
        if shape and shape[0] == 0 and decoded.model.batched:  # Triton mishandles an empty batch
            raise InvalidArgumentError(
                f"input '{name}' has batch size 0 for model '{request.model_name}'; send at least one row"
            )
        typed = tensor.HasField("contents")
        where = f"input tensor '{name}' for model '{request.model_name}'"
        if "shared_memory_region" in tensor.parameters:
            if typed:
                raise InvalidArgumentError(f"unexpected 'content' provided when using shared memory for {where}")
            ref = kserve.shm_reference(name, _tensor_parameters(tensor))
            return kserve.shm_input(decoded, self.shm, ref, name, datatype, shape), 0  # type: ignore[arg-type]
        if typed:
            if raw:
                raise InvalidArgumentError(
                    f"contents field must not be specified when using raw_input_contents for '{name}' "
                    f"for model '{request.model_name}'"
                )
            values = getattr(tensor.contents, kserve.contents_field(name, datatype))
            return kserve.array_from_values(name, datatype, shape, values), 0
        if used < len(raw):
            return kserve.array_from_bytes(name, datatype, shape, raw[used]), 1
        raise InvalidArgumentError(f"unable to find data for {where} in request.")

    def _submit(self, call: Call, decoded: kserve.Decoded, target: Any, stream: bool) -> Any:
        """Hand a decoded request to the core, to call ``target`` once it completes (or, for a
        stream, each time a response arrives); returns its cancel (or stream) handle."""
        tracer = self.server.tracer
        if tracer is not None:
            decoded.request.trace_parent = tracer.context_from_metadata(dict(call.metadata))
        return decoded.model.submit(decoded.request, None, target, stream, cancellable=not stream)

    def model_infer_in_c(self, call: Call, data: bytes) -> bool:
        """Hand a unary ModelInfer to the C path (``_native.grpc_model_infer``): decoded, run and
        answered without Python once submitted. False when it declines (not a plain request: see
        native/_native/kserve.c): the Python path then runs as before and words any error."""
        server = self.server
        if self.declined_options or c_path.server_declines(server, self.draining):
            return False  # (frontends/c_path.py)
        handle = grpc_model_infer(call, data, self._in_c, server._bound, server._handle)
        if type(handle) is tuple:  # no entry for its model yet, or its binding changed
            self._admit_in_c(*handle)
            handle = grpc_model_infer(call, data, self._in_c, server._bound, server._handle)
        if type(handle) is not InFlight:
            return False
        call.user = handle  # on_cancel cancels it in Triton
        return True

    def _admit_in_c(self, name: str, version: str) -> None:
        c_path.admit(self.server, self._in_c, name, version)

    def model_infer(self, request: Any, call: Call) -> None:
        decoded = self.decode(request, self.forwarded(call))
        if decoded.model.decoupled:  # Triton's check and words (grpc/infer_handler.cc)
            raise UnsupportedError("ModelInfer RPC doesn't support models with decoupled transaction policy")
        handle = self._submit(call, decoded, Reply(call, request, decoded, None), False)
        if handle is not None:
            call.user = handle  # on_cancel cancels it in Triton (an InFlight)

    def stream_message(self, call: Call, data: bytes) -> None:
        stream = call.user
        if stream is None:
            stream = call.user = Stream(call, self.forwarded(call))
            with self._streams_lock:
                self._streams.add(stream)
        try:
            request = service_pb2.ModelInferRequest.FromString(data)
        except DecodeError:
            stream.send(service_pb2.ModelStreamInferResponse(error_message="malformed ModelInferRequest message"))
            return
        stream.begin_one()
        try:  # a request's mistake fails that request only; the stream goes on
            decoded = self.decode(request, stream.headers)
            if decoded.model.decoupled:
                self._stream_decoupled(stream, call, request, decoded)
            else:
                reply = Reply(call, request, decoded, stream)
                handle = self._submit(call, decoded, reply, False)
                if handle is not None and not reply.finished:
                    reply.handle = handle
                    stream.handles.add(handle)
        except Exception as exc:
            if not isinstance(exc, TritonError):
                log.exception("gRPC ModelStreamInfer request failed")
            stream.send(service_pb2.ModelStreamInferResponse(error_message=str(exc)))
            stream.done_one()

    def _stream_decoupled(self, stream: Stream, call: Call, request: Any, decoded: kserve.Decoded) -> None:
        """One request of a decoupled model: its responses go out as they arrive."""
        final_flag = stream.final_flag(request)
        state: dict[str, Any] = {"handle": None, "early": False}
        lock = threading.Lock()

        def pull_responses() -> None:
            handle = state["handle"]
            if handle is None:  # a response came before _submit returned
                state["early"] = True
                return
            with lock:
                if state.get("ended"):
                    return
                while True:
                    try:
                        status, outputs = handle.next(False)
                        if status == STREAM_ITEM:
                            decoded.check_regions()
                    except TritonError as exc:
                        stream.send(service_pb2.ModelStreamInferResponse(error_message=str(exc)))
                        status = STREAM_END
                    if status == STREAM_EMPTY:
                        return
                    if status == STREAM_END:
                        break
                    response = encode(request, outputs, decoded)
                    if final_flag:
                        response.parameters["triton_final_response"].bool_param = False
                    stream.send(service_pb2.ModelStreamInferResponse(infer_response=response))
                state["ended"] = True
            if final_flag:
                empty = service_pb2.ModelInferResponse(
                    model_name=request.model_name, model_version=request.model_version or "1", id=request.id
                )
                empty.parameters["triton_final_response"].bool_param = True
                stream.send(service_pb2.ModelStreamInferResponse(infer_response=empty))
            stream.handles.discard(handle)
            handle.close()
            stream.done_one()

        handle = self._submit(call, decoded, pull_responses, True)
        state["handle"] = handle
        stream.handles.add(handle)
        if state["early"] or stream.cancelled:
            pull_responses()
