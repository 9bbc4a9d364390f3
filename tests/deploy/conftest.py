"""Fixtures for the deploy/ tests: the Kubernetes manifests read from deploy/k8s/ (PyYAML, which
kubernetes-validate installs) and the parts of the Deployment the tests compare.

``manifests``: file name (relative to deploy/k8s/) -> its YAML documents. ``deployment``,
``container``: the Deployment and its one container. ``serve_args``: the container's args read as
`embedtriton serve` reads them (target, ``--option value`` pairs, flags). ``prestop_sleep``: the
seconds the container's preStop hook sleeps.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
FLAGS = {"--no-shared-memory"}  # the serve options that take no value


def _yaml():
    try:
        import yaml
    except ImportError:
        pytest.skip("PyYAML is not installed (pip install kubernetes-validate: it brings PyYAML)")
    return yaml


def _parse_serve_args(args: list[str]) -> dict:
    """`embedtriton serve` args -> {"target": ..., "--grpc": "0.0.0.0:8001", ..., "--no-shared-memory": True}."""
    parsed: dict = {"target": args[0]}
    rest = iter(args[1:])
    for token in rest:
        assert token.startswith("--"), f"unexpected argument {token!r} in {args}"
        parsed[token] = True if token in FLAGS else next(rest)
    return parsed


@pytest.fixture(scope="session")
def manifests() -> dict[str, list[dict]]:
    yaml = _yaml()
    found = {}
    for path in sorted(K8S.rglob("*.yaml")):
        found[str(path.relative_to(K8S))] = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def _one(manifests: dict, kind: str) -> dict:
    objects = [doc for docs in manifests.values() for doc in docs if doc.get("kind") == kind]
    assert len(objects) == 1, f"expected one {kind} in deploy/k8s, found {len(objects)}"
    return objects[0]


@pytest.fixture(scope="session")
def one_of(manifests):
    """``one_of(kind)``: the one object of that kind in deploy/k8s (fails on none or several)."""
    return lambda kind: _one(manifests, kind)


@pytest.fixture(scope="session")
def deployment(manifests) -> dict:
    return _one(manifests, "Deployment")


@pytest.fixture(scope="session")
def container(deployment) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, "the tests expect the one embedtriton container"
    return containers[0]


@pytest.fixture(scope="session")
def serve_args(container) -> dict:
    return _parse_serve_args([str(a) for a in container["args"]])


@pytest.fixture(scope="session")
def prestop_sleep(container) -> int:
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return int(command[1]) if command[:1] == ["sleep"] else 0
