"""``ServerConfig`` -> ``TRITONSERVER_ServerOptions``: the one place that translates our
settings into Triton's."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from ctypes import byref
from pathlib import Path

from ..config import ServerConfig
from ..errors import NotFoundError
from . import capi
from .devices import require_gpu
from .runtime import Runtime
from .stubs import prefix as stub_prefix

_servers = itertools.count(1)


@contextmanager
def server_options(
    cfg: ServerConfig, runtime: Runtime, repository: Path, backends: Path, log_file: Path
) -> Iterator[int]:
    """Triton's server options for ``cfg`` (explicit model control on ``repository``, our
    backend found in ``backends``, Triton's log in ``log_file``); deleted on exit."""
    api = capi.api()
    options = capi.out_handle()
    api.ServerOptionsNew(byref(options))
    try:
        api.ServerOptionsSetServerId(options, cfg.id.encode())
        api.ServerOptionsSetModelRepositoryPath(options, str(repository).encode())
        api.ServerOptionsSetModelControlMode(options, capi.MODEL_CONTROL_EXPLICIT)
        api.ServerOptionsSetStrictModelConfig(options, cfg.disable_auto_complete_config)
        # Triton's options object leaves these two uninitialised (tritonserver's command line
        # always sets them): an unset retry count reloads a failing model forever.
        api.ServerOptionsSetModelLoadRetryCount(options, cfg.model_load_retry_count)
        api.ServerOptionsSetEnablePeerAccess(options, True)
        api.ServerOptionsSetStrictReadiness(options, cfg.strict_readiness)
        api.ServerOptionsSetExitTimeout(options, cfg.exit_timeout_secs)
        api.ServerOptionsSetBackendDirectory(options, str(backends).encode())
        api.ServerOptionsSetRepoAgentDirectory(options, str(backends).encode())
        api.ServerOptionsSetLogVerbose(options, cfg.log_verbose)
        api.ServerOptionsSetLogInfo(options, cfg.log_info)
        api.ServerOptionsSetLogWarn(options, cfg.log_warning)
        api.ServerOptionsSetLogError(options, cfg.log_error)
        api.ServerOptionsSetLogFile(options, str(log_file).encode())
        api.ServerOptionsSetMetrics(options, cfg.metrics)
        api.ServerOptionsSetGpuMetrics(options, False)
        api.ServerOptionsSetCpuMetrics(options, cfg.metrics and cfg.cpu_metrics)
        api.ServerOptionsSetMetricsInterval(options, cfg.metrics_interval_ms)
        api.ServerOptionsSetPinnedMemoryPoolByteSize(options, cfg.pinned_memory_pool_byte_size)
        for device, size in cfg.cuda_memory_pool_byte_size.items():
            require_gpu("ServerConfig.cuda_memory_pool_byte_size", int(device))
            api.ServerOptionsSetCudaMemoryPoolByteSize(options, device, size)
        api.ServerOptionsSetMinSupportedComputeCapability(options, cfg.min_supported_compute_capability)
        backend_config = {backend: dict(settings) for backend, settings in cfg.backend_config.items()}
        # Triton's python backend names its shared-memory regions with this prefix: its default
        # is the same for every process on the host, and two servers' stubs would read each
        # other's tensors. One prefix per server.
        backend_config.setdefault("python", {}).setdefault(
            "shm-region-prefix-name", f"{stub_prefix()}{next(_servers)}_"
        )
        for backend, settings in backend_config.items():
            for key, value in settings.items():
                api.ServerOptionsSetBackendConfig(options, backend.encode(), key.encode(), str(value).encode())
        caches = cfg.cache_settings()
        # Always set: Triton keeps the cache folder of the first server in the process.
        directory = cfg.cache_directory or (str(runtime.caches) if runtime.caches else None)
        if directory is not None:
            api.ServerOptionsSetCacheDirectory(options, directory.encode())
        if caches:
            if directory is None:
                raise NotFoundError(
                    f"cache_config is set but the Triton runtime ({runtime.origin}) has no caches/ "
                    "folder; set ServerConfig.cache_directory"
                )
            for name, settings_json in caches:
                api.ServerOptionsSetCacheConfig(options, name.encode(), settings_json.encode())
        yield options.value  # type: ignore[misc]  # a successful ServerOptionsNew set it (not NULL)
    finally:
        api.ServerOptionsDelete(options)


def apply_log_settings(log_info: bool, log_warning: bool, log_error: bool, verbose: int, iso8601: bool) -> None:
    """Change Triton's process-wide logger (its option setters apply to it at once)."""
    api = capi.api()
    options = capi.out_handle()
    api.ServerOptionsNew(byref(options))
    try:
        api.ServerOptionsSetLogInfo(options, log_info)
        api.ServerOptionsSetLogWarn(options, log_warning)
        api.ServerOptionsSetLogError(options, log_error)
        api.ServerOptionsSetLogVerbose(options, verbose)
        api.ServerOptionsSetLogFormat(options, 1 if iso8601 else 0)
    finally:
        api.ServerOptionsDelete(options)
