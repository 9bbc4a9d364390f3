"""The connection cap each endpoint derives from the process's descriptor limit
(embedtriton.frontends.descriptors), with the limit and the open descriptors made up."""

from __future__ import annotations

import logging
import resource

import pytest

from embedtriton.frontends import descriptors


@pytest.fixture
def rlimit(monkeypatch):
    """The process's RLIMIT_NOFILE as a dict entry the module reads and sets, 20 descriptors open."""
    state = {"nofile": (1024, 1024)}

    def setrlimit(which, value):
        if value[0] > state["nofile"][1]:
            raise ValueError("not allowed to raise maximum limit")
        state["nofile"] = value

    monkeypatch.setattr(descriptors.resource, "getrlimit", lambda which: state["nofile"])
    monkeypatch.setattr(descriptors.resource, "setrlimit", setrlimit)
    monkeypatch.setattr(descriptors, "open_descriptors", lambda: 20)
    return state


def test_the_soft_limit_is_raised_to_the_hard_limit_and_logged(rlimit, caplog):
    rlimit["nofile"] = (1024, 4096)
    with caplog.at_level(logging.INFO, logger="embedtriton"):
        assert descriptors.descriptor_limit() == 4096
    assert rlimit["nofile"] == (4096, 4096)
    assert "raised the descriptor limit (RLIMIT_NOFILE) from 1024 to its hard limit 4096" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="embedtriton"):
        assert descriptors.descriptor_limit() == 4096  # nothing left to raise: nothing logged
    assert not caplog.text


def test_a_limit_that_cannot_be_raised_is_kept(rlimit, monkeypatch, caplog):
    rlimit["nofile"] = (1024, 1 << 40)  # a hard limit over what the kernel takes (fs.nr_open)

    def refuse(which, value):
        raise ValueError("too big")

    monkeypatch.setattr(descriptors.resource, "setrlimit", refuse)
    with caplog.at_level(logging.INFO, logger="embedtriton"):
        assert descriptors.descriptor_limit() == 1024
    assert "cannot raise the descriptor limit" in caplog.text


@pytest.mark.parametrize(
    "nofile, max_connections, cap",
    [
        ((128, 128), 1024, (128 - 20 - 64) // 2),  # each endpoint's half of what is left
        ((128, 128), 10, 10),  # max_connections when it fits
        ((1024, 1 << 20), 1024, 1024),  # the soft limit is raised first
        ((64, 64), 1024, 1),  # at least one
        ((resource.RLIM_INFINITY, resource.RLIM_INFINITY), 1024, 1024),
    ],
)
def test_the_cap_is_max_connections_within_the_endpoints_share(rlimit, nofile, max_connections, cap):
    rlimit["nofile"] = nofile
    assert descriptors.connection_cap(max_connections, "gRPC") == cap
