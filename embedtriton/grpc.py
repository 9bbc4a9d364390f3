"""KServe-v2 gRPC endpoint (``inference.GRPCInferenceService``) for the in-process models.

Built on grpcio's asyncio server and the protobuf modules generated in
``tritonclient[grpc]``; every call goes through the same in-process path as
``Model.infer_async``. Install with ``pip install "embedtriton[grpc]"``.

Implemented so far: ServerLive, ServerReady, ModelReady, ServerMetadata,
ModelMetadata, ModelConfig, ModelStatistics, RepositoryIndex, ModelInfer (typed
``contents`` and ``raw_input_contents``, BYTES, parameters including priority,
timeout and sequence fields, requested outputs) and ModelStreamInfer (decoupled
models, with Triton's ``triton_enable_empty_final_response`` /
``triton_final_response`` convention). The other RPCs answer UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import (
    AlreadyExistsError,
    CancelledError,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
    UnsupportedError,
)
from .tensors import decode_bytes, encode_bytes, triton_dtype

if TYPE_CHECKING:
    from .server import Server

try:
    import grpc
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('the gRPC endpoint needs grpcio and tritonclient[grpc]: pip install "embedtriton[grpc]"') from exc

_NUMPY = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}  # fmt: skip
_CONTENTS = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip
_STATUS = [
    (InvalidArgumentError, "INVALID_ARGUMENT"),
    (NotFoundError, "NOT_FOUND"),
    (UnavailableError, "UNAVAILABLE"),
    (UnsupportedError, "UNIMPLEMENTED"),
    (AlreadyExistsError, "ALREADY_EXISTS"),
    (CancelledError, "CANCELLED"),
]


def _status(error: TritonError) -> grpc.StatusCode:
    for cls, name in _STATUS:
        if isinstance(error, cls):
            return getattr(grpc.StatusCode, name)
    return grpc.StatusCode.INTERNAL


def _parameter(value: Any) -> Any:
    which = value.WhichOneof("parameter_choice")
    return getattr(value, which) if which else None


def _input_array(tensor: Any, raw: bytes | None) -> np.ndarray:
    shape = tuple(int(d) for d in tensor.shape)
    datatype = tensor.datatype
    if raw is not None:
        if datatype == "BYTES":
            return decode_bytes(raw, shape)
        if datatype not in _NUMPY:
            raise InvalidArgumentError(f"input '{tensor.name}': datatype {datatype} is not supported")
        dtype = np.dtype(_NUMPY[datatype])
        if len(raw) != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
            raise InvalidArgumentError(
                f"input '{tensor.name}': {len(raw)} bytes of raw contents do not fill shape {list(shape)} of {datatype}"
            )
        return np.frombuffer(raw, dtype=dtype).reshape(shape)
    field = _CONTENTS.get(datatype)
    if field is None:
        raise InvalidArgumentError(f"input '{tensor.name}': datatype {datatype} has no typed contents")
    values = list(getattr(tensor.contents, field))
    if datatype == "BYTES":
        array = np.empty(len(values), dtype=object)
        array[:] = values
    else:
        array = np.array(values, dtype=_NUMPY[datatype])
    if array.size != int(np.prod(shape, dtype=np.int64)):
        raise InvalidArgumentError(f"input '{tensor.name}': {array.size} values do not fill shape {list(shape)}")
    return array.reshape(shape)


class _Service(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, server: Server) -> None:
        self.server = server

    async def _guard(self, context: Any, call: Any) -> Any:
        try:
            return await call() if asyncio.iscoroutinefunction(call) else call()
        except TritonError as exc:
            await context.abort(_status(exc), str(exc))

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=self.server.live)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.server.ready)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        ready = request.name in {m.name for m in self.server.models()} and self.server.model(request.name).ready
        return service_pb2.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        meta = await self._guard(context, self.server.metadata)
        return service_pb2.ServerMetadataResponse(
            name=meta.get("name", ""), version=meta.get("version", ""), extensions=meta.get("extensions", [])
        )

    def _model(self, name: str) -> Any:
        return self.server.model(name)  # NotFoundError for unknown names

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        meta = await self._guard(context, lambda: self._model(request.name).metadata())
        return json_format.ParseDict(meta, service_pb2.ModelMetadataResponse(), ignore_unknown_fields=True)

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        config = await self._guard(context, lambda: self._model(request.name).config())
        parsed = json_format.ParseDict(config, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
        return service_pb2.ModelConfigResponse(config=parsed)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        names = [request.name] if request.name else [m.name for m in self.server.models()]
        stats = await self._guard(context, lambda: [self._model(n).statistics() for n in names])
        return json_format.ParseDict(
            {"model_stats": stats}, service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=True
        )

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        entries = []
        for model in self.server.models():
            ready = model.ready
            if request.ready and not ready:
                continue
            entries.append(
                service_pb2.RepositoryIndexResponse.ModelIndex(
                    name=model.name, version="1", state="READY" if ready else "UNAVAILABLE"
                )
            )
        return service_pb2.RepositoryIndexResponse(models=entries)

    def _decode(self, request: Any) -> tuple[Any, dict[str, np.ndarray], dict[str, Any]]:
        """A ModelInferRequest as (model, inputs, keyword arguments for infer/stream)."""
        model = self._model(request.model_name)
        raw = list(request.raw_input_contents)
        if raw and len(raw) != len(request.inputs):
            raise InvalidArgumentError(
                f"{len(raw)} raw input contents for {len(request.inputs)} inputs: give all or none"
            )
        inputs = {t.name: _input_array(t, raw[i] if raw else None) for i, t in enumerate(request.inputs)}
        params = {k: _parameter(v) for k, v in request.parameters.items()}
        params.pop("triton_enable_empty_final_response", None)
        options: dict[str, Any] = {
            "priority": params.pop("priority", None),
            "timeout_us": params.pop("timeout", None),
            "request_id": request.id or None,
            "outputs": [o.name for o in request.outputs] or None,
        }
        sequence_id = params.pop("sequence_id", None)
        start = bool(params.pop("sequence_start", False))
        end = bool(params.pop("sequence_end", False))
        if sequence_id not in (None, 0, ""):
            options.update(correlation_id=sequence_id, sequence_start=start, sequence_end=end)
        options["parameters"] = params or None
        return model, inputs, options

    @staticmethod
    def _encode(request: Any, outputs: dict[str, np.ndarray]) -> Any:
        response = service_pb2.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version or "1", id=request.id
        )
        for name, array in outputs.items():
            datatype = triton_dtype(array.dtype)
            response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
            response.raw_output_contents.append(
                encode_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
            )
        return response

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        async def infer() -> Any:
            model, inputs, options = self._decode(request)
            return self._encode(request, await model.infer_async(inputs, **options))

        return await self._guard(context, infer)

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> Any:
        """Bidirectional stream: each request runs as it arrives (decoupled models stream
        0..N responses); errors come back as ``error_message`` and the stream goes on."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()

        async def serve_one(request: Any) -> None:
            final_flag = (
                _parameter(request.parameters["triton_enable_empty_final_response"])
                if ("triton_enable_empty_final_response" in request.parameters)
                else False
            )
            try:
                model, inputs, options = self._decode(request)
                binding = self.server._bound.get(model.name)
                if binding is not None and binding.decoupled:
                    async for outputs in model.stream_async(inputs, **options):
                        response = self._encode(request, outputs)
                        if final_flag:
                            response.parameters["triton_final_response"].bool_param = False
                        await queue.put(service_pb2.ModelStreamInferResponse(infer_response=response))
                    if final_flag:
                        empty = service_pb2.ModelInferResponse(
                            model_name=request.model_name, model_version=request.model_version or "1", id=request.id
                        )
                        empty.parameters["triton_final_response"].bool_param = True
                        await queue.put(service_pb2.ModelStreamInferResponse(infer_response=empty))
                else:
                    response = self._encode(request, await model.infer_async(inputs, **options))
                    if final_flag:
                        response.parameters["triton_final_response"].bool_param = True
                    await queue.put(service_pb2.ModelStreamInferResponse(infer_response=response))
            except TritonError as exc:
                await queue.put(service_pb2.ModelStreamInferResponse(error_message=str(exc)))

        async def read_requests() -> None:
            async for request in request_iterator:
                task = asyncio.ensure_future(serve_one(request))
                running.add(task)
                task.add_done_callback(running.discard)
            while running:
                await asyncio.gather(*list(running))
            await queue.put(None)

        reader = asyncio.ensure_future(read_requests())
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield item
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()


class GrpcEndpoint:
    """A grpcio asyncio server on its own thread and event loop."""

    def __init__(self, server: Server, address: str, max_message_bytes: int = 64 * 1024 * 1024) -> None:
        self.address = address
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="embedtriton-grpc", daemon=True)
        self._thread.start()
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]

        async def start() -> tuple[Any, int]:
            grpc_server = grpc.aio.server(options=options)
            service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_Service(server), grpc_server)
            port = grpc_server.add_insecure_port(address)
            await grpc_server.start()
            return grpc_server, port

        try:
            self._server, self.port = asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=30)
        except Exception as exc:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise UnavailableError(f"cannot serve gRPC on {address}: {exc}") from exc
        if self.port == 0:
            self.stop()
            raise UnavailableError(f"cannot serve gRPC on {address}: the address is in use or invalid")

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving: calls in progress get ``grace`` seconds to finish."""
        if self._loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self._server.stop(grace), self._loop)
        try:
            future.result(timeout=grace + 5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()
