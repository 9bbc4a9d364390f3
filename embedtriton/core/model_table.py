"""The server's table of models: the bound callables (and their versions) and ensembles, and
the Triton models of the user's repositories that are loaded; binding, loading, reloading and
unloading them in Triton. A part of :class:`CoreServer` (it reads the server's state)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..backend import library
from ..backend.batch import InferFunc
from ..backend.binding import Binding
from ..config import ModelConfig, ServerConfig, Tensor, name_tensors
from ..config.ensemble import Step
from ..config.triton_json import model_config_json
from ..errors import (
    MODEL_CONTROL_REFUSED,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    TritonError,
    UnavailableError,
)
from ..triton import control
from ..triton.log import log_size, logged_errors
from .declarations import check_config, check_declarations, check_versions
from .ensembles import bind_ensemble
from .generated_repository import GeneratedRepository
from .model import Model
from .onnx import onnx_model
from .repositories import LoadedModel, Repositories

if TYPE_CHECKING:
    from ..tracing import Tracer

log = logging.getLogger("embedtriton")


class ModelsMixin:
    """The model side of :class:`CoreServer`."""

    config: ServerConfig
    _lock: threading.RLock
    _handle: int | None
    _bound: dict[str, Binding]
    _versions: dict[str, dict[int, Binding]]
    _replaced: list[Binding]
    _repository_models: dict[str, Any]  # Triton models of the user's repositories that are loaded
    _repositories: Repositories
    _generated_repository: GeneratedRepository
    _log: Any
    _stopping: bool
    _tracer: Tracer | None
    _require_handle: Callable[[], int]  # (CoreServer's method)

    def bind(
        self,
        model_name: str,
        infer_func: InferFunc,
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        config: ModelConfig | None = None,
        strict: bool = False,
        version: int | None = None,
    ) -> Model:
        """Serve ``infer_func`` as model ``model_name`` (``version``: 1 for a new name; give
        another number to bind another version of a bound model, see ``VersionPolicy``).

        ``infer_func(requests)`` gets a list of requests (each a mapping input name ->
        array, with ``.parameters``) and returns one dict of outputs per request; decorate a
        function of batched arrays with :func:`embedtriton.batch`. Works before and after
        :meth:`start`; after start the model is loaded (and warmed up) before ``bind``
        returns. Outputs are always checked against ``outputs``; ``strict`` is accepted for
        PyTriton compatibility.
        """
        check_declarations(model_name, infer_func, inputs, outputs)
        config = config if config is not None else ModelConfig()
        check_config(model_name, config, self.config)
        if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
            raise InvalidArgumentError(f"version must be an integer >= 1, not {version!r}")
        binding = Binding(
            model_name, infer_func, name_tensors(inputs, "INPUT"), name_tensors(outputs, "OUTPUT"), config, version or 1
        )
        model_config_json(model_name, binding.inputs, binding.outputs, config, library.BACKEND_NAME)  # validates
        with self._lock:
            before = self._versions.get(model_name)
            if model_name in self._bound and (before is None or version is None):
                raise InvalidArgumentError(
                    f"model '{model_name}' is already bound; unbind() it first"
                    + (f", or bind another version with version=N (bound: {sorted(before)})" if before else "")
                )
            if before and binding.version in before:
                raise InvalidArgumentError(
                    f"version {binding.version} of model '{model_name}' is already bound; "
                    f"unbind('{model_name}', version={binding.version}) first"
                )
            versions = {**(before or {}), binding.version: binding}
            check_versions(model_name, versions)
            self._set_versions(model_name, versions)
            if self._handle is not None:
                try:
                    self._load(self._bound[model_name])
                except BaseException:
                    self._set_versions(model_name, before)
                    if before and any(b.warmup_error for b in versions.values()):  # it was unloaded: serve
                        self._load(self._bound[model_name])  # the versions bound before again
                    raise
        return Model(self, model_name, version if version is not None else -1)

    def bind_onnx(
        self, model_name: str, path: str, config: ModelConfig | None = None, version: int | None = None
    ) -> Model:
        """Serve an ONNX file as a model, run by the onnxruntime package through our backend
        (``pip install "embedtriton[onnx]"``): its tensors come from the graph, and a dynamic
        first axis means batching (``config.max_batch_size`` caps it). Otherwise as :meth:`bind`."""
        infer_func, inputs, outputs, config = onnx_model(path, config)
        return self.bind(model_name, infer_func, inputs, outputs, config, version=version)

    def _set_versions(self, name: str, versions: dict[int, Binding] | None) -> None:
        """A model's bound versions; the model-level binding (whose config Triton uses) is the highest."""
        kept = {id(b) for b in (versions or {}).values()}
        previous = list((self._versions.get(name) or {}).values()) or (
            [self._bound[name]] if name in self._bound else []
        )
        self._replaced = [b for b in self._replaced if b.alive]  # (those finalized since)
        self._replaced += [b for b in previous if id(b) not in kept and getattr(b, "alive", False)]  # not ensembles
        if versions:
            self._versions[name] = versions
            self._bound[name] = versions[max(versions)]
        else:
            self._versions.pop(name, None)
            self._bound.pop(name, None)

    def versions(self, name: str) -> list[int]:
        """The versions bound for model ``name`` (Triton serves some of them, by its VersionPolicy)."""
        if name in self._repository_models:
            return sorted(self._repositories.known[name].versions)
        return sorted(self._versions.get(name) or ([1] if name in self._bound else []))

    def bind_ensemble(
        self,
        model_name: str,
        steps: Sequence[Step],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        config: ModelConfig | None = None,
    ) -> Model:
        """Serve a pipeline of bound models as one model ``model_name``, run by Triton's
        ensemble scheduler: each :class:`Step` runs a model on ensemble tensors (the
        ensemble's ``inputs``, other steps' outputs) and names the tensors it produces; the
        steps form a DAG. Bind the step models first. ``config`` takes ``batching``,
        ``max_batch_size``, ``decoupled`` (needed when a step streams) and ``response_cache``.
        """
        return bind_ensemble(self, model_name, steps, inputs, outputs, config)

    def unbind(self, model_name: str, version: int | None = None) -> None:
        """Unload a bound model and forget it (waits until Triton has let go of it); with
        ``version``, only that version (the others keep serving)."""
        with self._lock:
            if model_name not in self._bound:
                raise NotFoundError(f"no model '{model_name}' is bound (bound: {sorted(self._bound)})")
            versions = self._versions.get(model_name) or {}
            if version is not None and version not in versions:
                raise NotFoundError(
                    f"version {version} of model '{model_name}' is not bound (bound: {sorted(versions)})"
                )
            if version is not None and len(versions) > 1:
                self._unbind_version(model_name, versions[version])
                return
            users = sorted(n for n, b in self._bound.items() if model_name in getattr(b, "step_models", ()))
            if users:
                raise InvalidArgumentError(
                    f"model '{model_name}' is a step of ensemble {users}: unbind the ensemble first"
                )
            bindings = list(versions.values()) or [self._bound[model_name]]
            if self._handle is not None:
                self._unload(self._handle, model_name)
            self._set_versions(model_name, None)
            for binding in bindings:
                if self._handle is not None:
                    binding.wait_finalized(self.config.exit_timeout_secs, library.native().delete_released)
                if self._generated_repository.models is not None:
                    library.bindings.pop(self._generated_repository.key(binding), None)
            if self._generated_repository.models is not None:
                self._generated_repository.remove(model_name)

    def _unbind_version(self, name: str, binding: Binding) -> None:
        """Forget one of several versions: Triton unloads it (its requests finish) and serves the others."""
        versions = dict(self._versions[name])
        del versions[binding.version]
        self._set_versions(name, versions)
        if self._generated_repository.models is not None:
            self._generated_repository.remove_version(name, binding.version)
        if self._handle is not None:
            self._load(self._bound[name])
            binding.wait_finalized(self.config.exit_timeout_secs, library.native().delete_released)
        library.bindings.pop(
            self._generated_repository.key(binding), None
        ) if self._generated_repository.models else None

    def unload(self, model_name: str) -> None:
        """Unload a bound model but keep it bound (its requests fail until :meth:`load`); a
        repository model is unloaded (explicit control mode)."""
        if self._repository_model(model_name):
            self._model_control(model_name)
            self._repositories.unload(model_name)
            return
        with self._lock:
            binding = self._running_binding(model_name)
            self._unload(self._handle, model_name)  # type: ignore[arg-type]
            binding.wait_finalized(self.config.exit_timeout_secs, library.native().delete_released)

    def load(self, model_name: str, config: ModelConfig | None = None) -> None:
        """Load a bound model again (after :meth:`unload`); loading a loaded model reloads it.

        With ``config``, the model is reloaded with that configuration (same callable and
        tensors; e.g. another ``max_batch_size`` or batcher), validated as :meth:`bind`
        validates it; if Triton refuses it, the model keeps its previous configuration.
        """
        if self._repository_model(model_name) and config is None:
            self._model_control(model_name)
            self._require_handle()
            self._repositories.load(model_name)  # as it is on disk now
            return
        with self._lock:
            binding = self._running_binding(model_name)
            if config is None:
                self._load(binding)
                return
            check_config(model_name, config, self.config)
            changed = Binding(model_name, binding.infer_func, binding.inputs, binding.outputs, config, binding.version)
            model_config_json(model_name, changed.inputs, changed.outputs, config, library.BACKEND_NAME)
            before = self._versions[model_name]
            check_versions(model_name, {**before, changed.version: changed})
            self._set_versions(model_name, {**before, changed.version: changed})
            try:
                self._load(changed)
            except BaseException:
                self._set_versions(model_name, before)
                library.bindings[self._generated_repository.key(binding)] = binding
                if any(b.warmup_error for b in before.values()) or changed.warmup_error:  # it was unloaded:
                    self._load(binding)  # serve the previous config again
                raise

    def _model_control(self, model_name: str) -> None:
        """Repository models are loaded and unloaded on request in explicit mode only (Triton's rule)."""
        if self.config.model_control_mode != "explicit":
            raise UnavailableError(MODEL_CONTROL_REFUSED)

    def _running_binding(self, model_name: str) -> Binding:
        binding = self._bound.get(model_name)
        if binding is None:
            raise NotFoundError(f"no model '{model_name}' is bound (bound: {sorted(self._bound)})")
        if self._handle is None:
            raise UnavailableError("the server is not running")
        return binding

    def _bind_versions(self, name: str, imported: dict[int, tuple[Any, Any, Any, ModelConfig]]) -> None:
        """A repository's callable model: every version as on disk now, replacing what it had
        (a changed model.py is a new binding, reloaded by Triton); on failure what served stays."""
        with self._lock:
            if name in self._bound and name not in self._repositories.known:
                raise InvalidArgumentError(f"model '{name}' is bound by the application and in a model repository")
            versions: dict[int, Binding] = {}
            for version, (func, inputs, outputs, config) in imported.items():
                check_declarations(name, func, inputs, outputs)
                check_config(name, config, self.config)
                binding = Binding(
                    name, func, name_tensors(inputs, "INPUT"), name_tensors(outputs, "OUTPUT"), config, version
                )
                model_config_json(name, binding.inputs, binding.outputs, config, library.BACKEND_NAME)  # validates
                versions[version] = binding
            if not versions:
                raise InvalidArgumentError(f"model '{name}': no version folder holds a model.py")
            check_versions(name, versions)
            before = self._versions.get(name)
            self._set_versions(name, versions)
            if self._handle is None:
                return
            for gone in set(before or ()) - set(versions):
                self._generated_repository.remove_version(name, gone)
            try:
                self._load(self._bound[name])
            except BaseException:
                self._set_versions(name, before)
                if before:
                    self._load(self._bound[name])  # serve what served before
                raise

    def _load_repository_model(self, name: str, path: Any) -> None:
        """A repository's Triton model (its own config.pbtxt), linked into the server's repository."""
        with self._lock:
            if name in self._bound:
                raise InvalidArgumentError(f"model '{name}' is bound by the application and in a model repository")
            link = self._generated_repository.model_dir(name)
            if not link.is_symlink():
                link.symlink_to(path, target_is_directory=True)
            log_offset = log_size(self._log)
            handle = self._require_handle()
            try:
                control.load_model(handle, name, None)
            except TritonError as exc:
                details = logged_errors(self._log, log_offset, str(exc))
                raise type(exc)(f"{exc}: {details}" if details else str(exc)) from None
            self._repository_models[name] = LoadedModel.read(handle, name, path)

    def _unload_repository_model(self, name: str) -> None:
        with self._lock:
            if self._repository_models.pop(name, None) is not None and self._handle is not None:
                self._unload(self._handle, name)
            link = self._generated_repository.model_dir(name)
            if link.is_symlink():
                link.unlink()

    def _repository_model(self, name: str) -> bool:
        """Whether ``name`` is a model of the user's repositories (not bound by the application)."""
        return (
            name in self._repository_models
            or name in self._repositories.known
            or (name not in self._bound and self._repositories.holds(name))
        )

    def binding(self, name: str) -> Binding | None:
        """What ``bind`` was given for model ``name`` (callable, tensors, config), or None."""
        return self._bound.get(name)

    def model(self, name: str, version: int = -1) -> Model:
        """A handle on model ``name`` (``version`` -1: the latest ready one, as Triton picks it)."""
        if name not in self._bound and name not in self._repository_models:
            raise NotFoundError(f"no model '{name}' (bound: {sorted(self._bound)})")
        return Model(self, name, version)

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's RepositoryIndex: every version of every bound model (READY or UNAVAILABLE),
        the repositories' Triton models as Triton lists them (a failed one UNAVAILABLE with its
        reason), and the repositories' other models by name alone (not loaded) or UNAVAILABLE
        with the reason their last load failed."""
        entries: list[dict[str, str]] = []
        triton: dict[str, list[dict[str, str]]] = {}
        if self._handle is not None:
            for entry in control.model_index(self._handle):
                triton.setdefault(entry["name"], []).append(entry)
        for name in self._bound:
            for version in self.versions(name):
                ready = Model(self, name, version).ready
                entries.append({"name": name, "version": str(version), "state": "READY" if ready else "UNAVAILABLE"})
        for name in self._repository_models:
            entries += triton.get(name, [])
        for name, reason in sorted(self._repositories.unloaded().items()):
            if name in triton:  # a Triton model whose load failed: Triton says why
                entries += triton[name]
            elif reason is not None:
                entries.append({"name": name, "state": "UNAVAILABLE", "reason": reason})
            else:
                entries.append({"name": name})
        if ready_only:
            entries = [e for e in entries if e.get("state") == "READY"]
        return [{k: str(v) for k, v in e.items() if k in ("name", "version", "state", "reason")} for e in entries]

    def models(self) -> list[Model]:
        """Handles on every bound model (and the repositories' loaded ones)."""
        return [Model(self, name) for name in [*self._bound, *self._repository_models]]

    def _load(self, binding: Binding) -> None:
        """Load (or reload) a model: every bound version's folder, Triton's config from the
        model-level binding; Triton loads the versions its version policy picks."""
        versions = [b for b in (self._versions.get(binding.name) or {}).values() if b is not binding] + [binding]
        for each in versions:  # the model-level binding last: its files win
            if isinstance(each, Binding):  # Triton's config, so its queue policies, are the model-level one's
                each.queue_gate = binding.queue_gate
            self._generated_repository.write(each)
            library.bindings[self._generated_repository.key(each)] = each
        config = binding.triton_config(library.library_path())
        started = time.perf_counter()
        log_offset = log_size(self._log)
        for each in versions:
            each.warming, each.warmup_error = True, None
        try:
            control.load_model(self._require_handle(), binding.name, config)
        except TritonError as exc:
            library.bindings.pop(self._generated_repository.key(binding), None)
            details = logged_errors(self._log, log_offset, str(exc))
            if details:
                raise type(exc)(f"{exc}: {details}") from None
            raise
        finally:
            for each in versions:
                each.warming = False
        binding.loaded_at = time.monotonic()
        failed = next((b for b in versions if b.warmup_error is not None), None)
        if failed is not None:  # Triton saw a success (see Binding.warmup_runs): unload
            self._unload(self._require_handle(), binding.name)
            for each in versions:
                each.wait_finalized(self.config.exit_timeout_secs, library.native().delete_released)
            library.bindings.pop(self._generated_repository.key(binding), None)
            raise InternalError(f"failed to load '{binding.name}': its warm-up failed: {failed.warmup_error}")
        log.info("model '%s' ready in %.3f s", binding.name, time.perf_counter() - started)

    def _unload(self, handle: int, name: str, deadline: float | None = None) -> None:
        # Triton 2.51 crashes when a model is deleted while its instance thread is still
        # finishing its last task (here: the load); give that thread a moment.
        binding = self._bound.get(name)
        settle = 0.02 - (time.monotonic() - binding.loaded_at) if binding and binding.loaded_at else 0
        if settle > 0:
            time.sleep(settle)
        if deadline is None:
            deadline = time.monotonic() + self.config.exit_timeout_secs
        try:
            control.unload_model(handle, name, deadline, library.native().delete_released)
        except TritonError as exc:
            log.warning("unloading model '%s': %s", name, exc)
