"""RepositoryIndex, RepositoryModelLoad and RepositoryModelUnload for a server of bound models,
in Triton's words where clients compare them; loads and unloads run off the transport's thread."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from tritonclient.grpc import service_pb2

from ...core import CoreServer
from ...errors import InvalidArgumentError, TritonError
from .. import kserve_extensions
from .infer import parameter
from .transport import INTERNAL, OK, Call, code_of

log = logging.getLogger("embedtriton")


class Repository:
    """The model-repository RPCs of one server."""

    def __init__(self, server: CoreServer) -> None:
        self.server = server

    def index(self, request: Any, call: Call) -> Any:
        entries = [
            service_pb2.RepositoryIndexResponse.ModelIndex(**entry)
            for entry in kserve_extensions.repository_index(self.server, request.ready)
        ]
        return service_pb2.RepositoryIndexResponse(models=entries)

    def load(self, request: Any, call: Call) -> Any:
        if request.repository_name:
            raise InvalidArgumentError("'repository_name' specification is not supported")
        params = {key: parameter(value) for key, value in request.parameters.items()}
        for key, value in params.items():  # as Triton's gRPC handler types them, before the core sees them
            if key.startswith("file:") and not isinstance(value, bytes):
                raise InvalidArgumentError(f"invalid value type for load parameter '{key}', expected bytes_param.")
        work = kserve_extensions.load_work(self.server, request.model_name, params)
        self._run_blocking(call, work, service_pb2.RepositoryModelLoadResponse)

    def unload(self, request: Any, call: Call) -> Any:
        params = {key: parameter(value) for key, value in request.parameters.items()}
        work = kserve_extensions.unload_work(self.server, request.model_name, params)
        if work is None:  # Triton: nothing to unload is success
            return service_pb2.RepositoryModelUnloadResponse()
        self._run_blocking(call, work, service_pb2.RepositoryModelUnloadResponse)

    @staticmethod
    def _run_blocking(call: Call, work: Callable[[], Any], response: Any) -> None:
        """Run slow work (model load/unload) off the transport's thread; answer when done."""

        def run() -> None:
            try:
                work()
            except TritonError as exc:
                call.finish(code_of(exc), str(exc))
                return
            except Exception as exc:
                log.exception("gRPC %s failed", call.method)
                call.finish(INTERNAL, f"{type(exc).__name__}: {exc}")
                return
            call.send(response().SerializeToString())
            call.finish(OK)

        threading.Thread(target=run, name="embedtriton-grpc-admin", daemon=True).start()
