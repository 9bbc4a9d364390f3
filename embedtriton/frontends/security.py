"""Restricted APIs and header forwarding: Triton's ``--grpc-restricted-protocol`` /
``--http-restricted-api`` and ``--grpc-header-forward-pattern`` / ``--http-header-forward-pattern``,
parsed and checked once for both endpoints.

A restriction spec is Triton's ``<group>,<group>,...:<header>=<value>``. The groups are Triton's
(``src/restricted_features.h``): health, metadata, inference, shared-memory, model-config,
model-repository, statistics, trace, logging. A request to a restricted group must carry the
header with exactly that value, or it is refused: gRPC with UNAVAILABLE "This protocol is
restricted, expecting header '...'", HTTP with 403 and ``{"error": "This API is restricted,
expecting header '...'"}``. On gRPC the header is Triton's ``triton-grpc-protocol-<header>``.
Values are compared in constant time (:func:`hmac.compare_digest` over SHA-256 digests, so
neither the value nor its length shows in the time a refusal takes).

A forward pattern is a regular expression searched (not fully matched) in each request
header's name, ignoring case, as Triton does (``(?i)`` prepended, RE2's ``PartialMatch``); the
headers it finds become string parameters of inference requests, after (so over) the
request's own parameters of the same name.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import InvalidArgumentError

# Triton's restricted categories, in its order (RESTRICTED_CATEGORY_NAMES)
GROUPS = (
    "health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics", "trace",
    "logging",
)  # fmt: skip

# Groups of ours that only the HTTP endpoint has: "openai" (the OpenAI-compatible /v1/ routes)
HTTP_GROUPS = ("openai",)

# What Triton prefixes to the header of a --grpc-restricted-protocol spec (kRestrictedProtocolHeaderTemplate)
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

# gRPC method -> group, as Triton's grpc_server.cc registers each handler (Watch, which Triton does
# not serve, goes with Check)
GRPC_GROUPS: dict[str, str] = {
    **{f"/inference.GRPCInferenceService/{m}": "health" for m in ("ServerLive", "ServerReady", "ModelReady")},
    **{f"/grpc.health.v1.Health/{m}": "health" for m in ("Check", "Watch")},
    **{f"/inference.GRPCInferenceService/{m}": "metadata" for m in ("ServerMetadata", "ModelMetadata")},
    **{f"/inference.GRPCInferenceService/{m}": "inference" for m in ("ModelInfer", "ModelStreamInfer")},
    "/inference.GRPCInferenceService/ModelConfig": "model-config",
    "/inference.GRPCInferenceService/ModelStatistics": "statistics",
    **{
        f"/inference.GRPCInferenceService/Repository{m}": "model-repository"
        for m in ("Index", "ModelLoad", "ModelUnload")
    },
    **{
        f"/inference.GRPCInferenceService/{kind}SharedMemory{m}": "shared-memory"
        for kind in ("System", "Cuda")
        for m in ("Status", "Register", "Unregister")
    },
    "/inference.GRPCInferenceService/TraceSetting": "trace",
    "/inference.GRPCInferenceService/LogSettings": "logging",
}

# Metadata that grpc-core keeps for itself and never shows a server (so Triton never forwards it);
# our native transport hands these to the service too, so they are left out here.
GRPC_TRANSPORT_HEADERS = frozenset(
    {"content-type", "te", "grpc-encoding", "grpc-accept-encoding", "grpc-timeout", "grpc-internal-encoding-request",
     "grpc-previous-rpc-attempts", "grpc-retry-pushback-ms"}
)  # fmt: skip


def _digest(value: str | bytes) -> bytes:
    """SHA-256 of a received header value: the bytes as they came (our transports hand text
    over as the latin-1 decoding of those bytes)."""
    if isinstance(value, str):
        try:
            data = value.encode("latin-1")
        except UnicodeEncodeError:
            data = value.encode("utf-8", "surrogatepass")
    else:
        data = value
    return hashlib.sha256(data).digest()


@dataclass(frozen=True)
class Restriction:
    """The header a restricted group needs, and the refusal that names it."""

    header: str  # lower-case: gRPC metadata keys arrive lower-cased, HTTP names compare without case
    message: str  # Triton's refusal, naming the header (never the value)
    _expected: bytes = field(repr=False)  # SHA-256 of the value

    def admits(self, value: str | bytes | None) -> bool:
        """Whether a request whose header has ``value`` (None: absent) may go on. Constant time."""
        presented = _digest(b"" if value is None else value)
        return hmac.compare_digest(presented, self._expected) and value is not None


class RestrictedApis:
    """Triton's restricted-feature table for one endpoint, from its specs (``--<option>``).

    ``noun`` is what Triton calls a group in that option's messages: "protocol" for gRPC, "api"
    for HTTP. ``extra_groups``: groups of this endpoint besides Triton's. Invalid specs raise :class:`InvalidArgumentError` in the words of Triton's parser,
    plus what to fix.
    """

    def __init__(
        self,
        specs: Sequence[str],
        *,
        option: str,
        noun: str,
        header_prefix: str = "",
        extra_groups: Sequence[str] = (),
    ) -> None:
        self._by_group: dict[str, Restriction] = {}
        known = (*GROUPS, *extra_groups)
        refusal = "protocol" if noun == "protocol" else "API"
        for spec in specs:
            groups, header, value = _split(spec, option)
            header = (header_prefix + header).lower()
            for group in groups.split(","):
                if group not in known:
                    raise InvalidArgumentError(
                        f"unknown restricted {noun} '{group}' in --{option}: the groups are {', '.join(known)}"
                    )
                if group in self._by_group:
                    raise InvalidArgumentError(
                        f"restricted {noun} '{group}' can not be specified in multiple config groups "
                        f"(--{option}): name each group in one spec only"
                    )
                message = f"This {refusal} is restricted, expecting header '{header}'"
                expected = hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()  # as Triton's argv bytes
                self._by_group[group] = Restriction(header, message, expected)

    def __bool__(self) -> bool:
        return bool(self._by_group)

    def get(self, group: str | None) -> Restriction | None:
        """The restriction of ``group`` (None when it is open)."""
        return self._by_group.get(group) if group is not None else None

    @property
    def groups(self) -> dict[str, str]:
        """Restricted group -> the header it needs."""
        return {group: r.header for group, r in self._by_group.items()}


def _split(spec: object, option: str) -> tuple[str, str, str]:
    """``<groups>:<header>=<value>`` as Triton's ParseGenericConfigOption splits it: the groups
    before the first ':', the header up to the first '=' after it, the value after that."""
    if not isinstance(spec, str):
        raise InvalidArgumentError(f"--{option} takes strings '<group>,...:<header>=<value>', not {spec!r}")
    colon = spec.find(":")
    equals = spec.find("=", colon + 1) if colon >= 0 else -1
    groups, header, value = spec[:colon], spec[colon + 1 : equals], spec[equals + 1 :]
    if colon < 0 or equals < 0 or not groups or not header or not value:
        raise InvalidArgumentError(
            f"--{option} option format is '<config name>:<setting>=<value>'. Got {spec} "
            f"(e.g. 'inference,model-repository:my-token=s3cret'; the groups are {', '.join(GROUPS)})"
        )
    return groups, header, value


def specs(value: str | Iterable[str] | None, what: str) -> tuple[str, ...]:
    """Restriction specs as a tuple: one string, several, or none (None or ``()``)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise InvalidArgumentError(f"{what} takes a spec string or a list of them, not {value!r}")
    return tuple(value)


def forward_pattern(pattern: str | None, what: str) -> re.Pattern[str] | None:
    """The compiled header-forward pattern (case-insensitive), or None for none."""
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise InvalidArgumentError(f"{what} must be a regular expression string, not {pattern!r}")
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise InvalidArgumentError(f"{what} {pattern!r} is not a valid regular expression: {exc}") from None


def forwarded(
    pattern: re.Pattern[str], headers: Iterable[tuple[str, str | bytes]], grpc: bool = False
) -> dict[str, str]:
    """The request parameters a forward pattern makes of ``(name, value)`` headers: each header
    whose name the pattern finds (searched, not fully matched), under its name as received, its
    value as text. For a name sent twice the last value wins, as it does in Triton's parameter list.
    ``grpc``: leave out the metadata grpc-core keeps from Triton, and binary (``-bin``) metadata,
    which a text parameter cannot carry."""
    found: dict[str, str] = {}
    for name, value in headers:
        if grpc and (name in GRPC_TRANSPORT_HEADERS or name.endswith("-bin")):
            continue
        if not pattern.search(name):
            continue
        found[name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return found
