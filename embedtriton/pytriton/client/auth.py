"""PyTriton 0.7's ``pytriton.client.auth``: the header that carries an access token to the
restricted endpoints (``Triton(security_config=...)``, Triton's restricted APIs) on each protocol."""

from __future__ import annotations

from collections.abc import Mapping

from ...frontends.security import GRPC_HEADER_PREFIX

TRITON_ACCESS_HEADER = "triton-access-token"  # PyTriton's header name
GRPC_ACCESS_HEADER = GRPC_HEADER_PREFIX + TRITON_ACCESS_HEADER  # what Triton expects of gRPC calls for it


def create_auth_headers(access_token: str | None, protocol: str) -> dict[str, str]:
    """The headers that send ``access_token``: ``triton-access-token`` over HTTP,
    ``triton-grpc-protocol-triton-access-token`` over gRPC (Triton prefixes gRPC restriction
    headers). ValueError for an empty token or a protocol other than http and grpc."""
    if not access_token:
        raise ValueError("access_token cannot be None or empty")
    kind = protocol.lower()
    if kind not in ("http", "grpc"):
        raise ValueError(f"Invalid protocol '{protocol}'. Must be 'http' or 'grpc'")
    return {TRITON_ACCESS_HEADER if kind == "http" else GRPC_ACCESS_HEADER: access_token}


def extract_access_token_from_headers(headers: Mapping[str, str] | None) -> str | None:
    """The token in headers made by :func:`create_auth_headers` (either protocol's), or None;
    ValueError when both protocols' headers are there with different tokens."""
    if not headers:
        return None
    http_token, grpc_token = headers.get(TRITON_ACCESS_HEADER), headers.get(GRPC_ACCESS_HEADER)
    if http_token is not None and grpc_token is not None and http_token != grpc_token:
        raise ValueError(
            f"Conflicting authentication headers found: '{TRITON_ACCESS_HEADER}' and '{GRPC_ACCESS_HEADER}' contain "
            "different tokens. Please use consistent tokens."
        )
    return http_token or grpc_token
