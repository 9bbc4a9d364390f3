"""RepositoryIndex, RepositoryModelLoad and RepositoryModelUnload for a server of bound models,
in Triton's words where clients compare them; loads and unloads run off the transport's thread."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from tritonclient.grpc import service_pb2

from ...config.override import parse_override
from ...core import CoreServer
from ...errors import InternalError, InvalidArgumentError, TritonError, UnavailableError
from .transport import INTERNAL, OK, Call, code_of

log = logging.getLogger("embedtriton")


class Repository:
    """The model-repository RPCs of one server."""

    def __init__(self, server: CoreServer) -> None:
        self.server = server

    def index(self, request: Any, call: Call) -> Any:
        entries = []
        for model in self.server.models():  # one entry per bound version, as Triton lists them
            for version in self.server.versions(model.name):
                ready = self.server.model(model.name, version).ready
                if request.ready and not ready:
                    continue
                entries.append(
                    service_pb2.RepositoryIndexResponse.ModelIndex(
                        name=model.name, version=str(version), state="READY" if ready else "UNAVAILABLE"
                    )
                )
        return service_pb2.RepositoryIndexResponse(models=entries)

    def load(self, request: Any, call: Call) -> Any:
        name = request.model_name
        if request.repository_name:
            raise InvalidArgumentError("'repository_name' specification is not supported")
        config_text = None
        for key, value in request.parameters.items():  # as Triton reads them, in Triton's words
            which = value.WhichOneof("parameter_choice")
            if key == "config":
                if which != "string_param":
                    raise InvalidArgumentError(f"invalid value type for load parameter '{key}', expected string_param.")
                config_text = value.string_param
            elif key.startswith("file:"):
                raise InvalidArgumentError(
                    f"failed to load '{name}': load parameter '{key}' uploads model files, which a server of bound "
                    "Python callables does not take; send a 'config' override, or bind the model in the application"
                )
            else:
                raise InvalidArgumentError(f"unrecognized load parameter '{key}'.")
        self._check_mode()
        binding = self.server.binding(name)
        in_repository = binding is None and self.server._repository_model(name)
        if binding is None and not in_repository:  # Triton: a name its repository does not have
            raise InternalError(f"failed to load '{name}', failed to poll from model repository")
        config = None
        if config_text is not None:
            if binding is None or in_repository:
                raise InvalidArgumentError(
                    f"failed to load '{name}': a config override applies to models bound by the application; "
                    "a repository model takes its config from its folder"
                )
            config = parse_override(config_text, name, binding.inputs, binding.outputs, binding.config)
        self._run_blocking(call, lambda: self.server.load(name, config), service_pb2.RepositoryModelLoadResponse)

    def unload(self, request: Any, call: Call) -> Any:
        self._check_mode()
        name = request.model_name
        if self.server.binding(name) is None and not self.server._repository_model(name):  # Triton: success
            return service_pb2.RepositoryModelUnloadResponse()
        self._run_blocking(
            call, lambda: self.server.unload(request.model_name), service_pb2.RepositoryModelUnloadResponse
        )

    def _check_mode(self) -> None:
        """As Triton: load and unload requests only in explicit model control mode."""
        if self.server.config.model_control_mode != "explicit":
            raise UnavailableError("explicit model load / unload is not allowed if polling is enabled")

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
