"""How many connections an endpoint may hold, from the process's descriptor limit.

Every connection costs a file descriptor, and a process that runs out of them fails in places that
have nothing to do with connections: loading a model, registering shared memory, Triton's own
files. So each endpoint caps its connections below the limit, and at the cap closes an idle
connection to admit a new one (README "Security").
"""

from __future__ import annotations

import logging
import os
import resource
import sys

log = logging.getLogger("embedtriton")

RESERVED = 64  # descriptors left to the rest of the process: model files, shared memory, Triton's own
ENDPOINTS = 2  # the gRPC and HTTP endpoints share the process's limit: each may take half of what is left


def descriptor_limit() -> int:
    """The process's descriptor limit (soft RLIMIT_NOFILE), raised to the hard limit first, as Go's
    runtime does at start: the soft limit (often 1024) only exists for old programs that use
    select(), while a server needs a descriptor per client. Processes started afterwards inherit
    the raised limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and soft != resource.RLIM_INFINITY:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:  # e.g. a hard limit over the kernel's fs.nr_open
            log.warning("cannot raise the descriptor limit (RLIMIT_NOFILE) from %d to %d: %s", soft, hard, exc)
        else:
            log.info("raised the descriptor limit (RLIMIT_NOFILE) from %d to its hard limit %d", soft, hard)
            soft = hard
    return sys.maxsize if soft == resource.RLIM_INFINITY else soft


def open_descriptors() -> int:
    """How many descriptors the process has open (0 without /proc)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def connection_cap(max_connections: int, endpoint: str) -> int:
    """``max_connections``, lowered if need be to the endpoint's share of the descriptors left:
    (limit - descriptors open now - RESERVED) // ENDPOINTS, at least 1."""
    limit = descriptor_limit()
    in_use = open_descriptors()
    cap = min(max_connections, max(1, (limit - in_use - RESERVED) // ENDPOINTS))
    if cap < max_connections:
        log.info(
            "%s: at most %d connections, not max_connections %d: the descriptor limit is %d, %d in use",
            endpoint,
            cap,
            max_connections,
            limit,
            in_use,
        )
    return cap
