"""Settings of the embedded Triton server: Triton's own options only (endpoints have theirs,
e.g. :class:`embedtriton.frontends.grpc.GrpcOptions`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import InvalidArgumentError
from ..tracing import Tracing


@dataclass
class ServerConfig:
    """Settings of the embedded Triton server.

    ``cache_config`` takes Triton's ``--cache-config`` strings, e.g. ``["local,size=1048576"]``.

    ``model_control_mode`` is Triton's ``--model-control-mode``, with its default, ``"none"``:

    - ``"none"``: every model of ``model_repository`` loads at start; network clients may not
      load or unload models (gRPC RepositoryModelLoad/Unload and HTTP
      ``/v2/repository/models/{m}/load|unload`` answer UNAVAILABLE, HTTP 503, "explicit model
      load / unload is not allowed if polling is enabled", as Triton answers);
    - ``"explicit"``: network clients may load and unload models (bound callables and
      repository models; a repository's models load on request only, none at start);
    - ``"poll"``: as ``"none"``, and the repositories are watched every ``repository_poll_secs``.

    The mode says what *network clients* and repository models may do. The application itself
    binds, unbinds, loads (with a new ``config`` too) and unloads its bound callables in every
    mode; ``server.load``/``unload`` of a repository model follow the mode, as Triton's.
    """

    id: str = "triton"  # the name server metadata reports; Triton's own default, which clients may expect
    cache_config: list[str] = field(default_factory=list)
    cache_directory: str | None = None
    exit_timeout_secs: int = 30
    strict_readiness: bool = True
    metrics: bool = True
    cpu_metrics: bool = True
    # How often Triton samples CPU/memory metrics. Its thread sleeps half of this and the
    # process waits for it at exit: Triton's 2000 ms default adds ~1 s to every exit.
    metrics_interval_ms: int = 200
    log_verbose: int = 0
    log_info: bool = False
    log_warning: bool = False
    log_error: bool = True
    log_file: str | None = None  # Triton's log; a file in the server's temporary folder by default
    pinned_memory_pool_byte_size: int = 0
    cuda_memory_pool_byte_size: dict[int, int] = field(default_factory=dict)
    min_supported_compute_capability: float = 6.0
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    # Triton model repositories served next to bound callables (see README "Model repositories")
    model_repository: list[str] = field(default_factory=list)
    # Triton's default: repository models load at start, network clients may not load or unload
    model_control_mode: str = "none"  # "none" | "explicit" (clients may load/unload) | "poll" (watched)
    repository_poll_secs: float = 15.0
    # Triton's --model-load-retry-count: how often a model that failed to load is tried again
    model_load_retry_count: int = 0
    # Triton's --disable-auto-complete-config: by default (as in tritonserver) backends complete
    # a repository model's config (the python backend's auto_complete_config, a folder without
    # config.pbtxt)
    disable_auto_complete_config: bool = False
    tracing: Tracing | None = None  # OpenTelemetry spans from Triton's trace timestamps; off by default

    def validate(self) -> None:
        """Raise :class:`InvalidArgumentError` for settings Triton would refuse or misread."""
        if isinstance(self.model_repository, str):
            self.model_repository = [self.model_repository]
        if not isinstance(self.model_repository, list) or not all(isinstance(p, str) for p in self.model_repository):
            raise InvalidArgumentError(
                f"ServerConfig.model_repository must be a list of folders, not {self.model_repository!r}"
            )
        if self.model_control_mode not in ("none", "explicit", "poll"):
            raise InvalidArgumentError(
                f"ServerConfig.model_control_mode must be 'none', 'explicit' or 'poll', not {self.model_control_mode!r}"
            )
        poll = self.repository_poll_secs
        if not isinstance(poll, (int, float)) or isinstance(poll, bool) or not poll > 0:
            raise InvalidArgumentError(f"ServerConfig.repository_poll_secs must be > 0, not {poll!r}")
        self.cache_settings()
        for name, least in (("exit_timeout_secs", 0), ("metrics_interval_ms", 1), ("model_load_retry_count", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise InvalidArgumentError(f"ServerConfig.{name} must be an integer >= {least}, not {value!r}")

    def cache_settings(self) -> list[tuple[str, str]]:
        """``[(cache name, config JSON)]`` from ``cache_config``."""
        grouped: dict[str, dict[str, str]] = {}
        for entry in self.cache_config:
            name, _, rest = entry.partition(",")
            pairs = [pair.partition("=") for pair in filter(None, rest.split(","))]
            if not name.strip() or (rest and not pairs) or any(not key.strip() or not eq for key, eq, _ in pairs):
                raise InvalidArgumentError(
                    f"cache_config entry {entry!r}: expected 'NAME,KEY=VALUE[,KEY=VALUE]', e.g. 'local,size=1048576'"
                )
            settings = grouped.setdefault(name.strip(), {})
            for key, _, value in pairs:
                settings[key.strip()] = value.strip()
        return [(name, json.dumps(settings)) for name, settings in grouped.items()]
