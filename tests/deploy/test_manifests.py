"""deploy/: the Kubernetes manifests and the container recipe, checked without a cluster or docker.

Every manifest validates against Kubernetes' own schemas (kubernetes-validate, strict: unknown
fields fail) for the oldest Kubernetes the Deployment supports (native gRPC probes: 1.27) and the
newest whose schemas the package bundles. Then the files are held to each other and to the real
server: the ports in the container's args are the probes', the Service's and the image's; the
grace period covers the drain; the metric names the autoscaler depends on are in what a real
embedtriton server exports; the Dockerfile's ENTRYPOINT runs what the Deployment's args expect.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import re
import shlex
import urllib.request
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OLDEST_KUBERNETES = "1.27"  # grpc: probes are GA from 1.27
RUNTIME_ONLY = {"kustomization.yaml", "monitoring/prometheus-adapter-values.yaml", "monitoring/podmonitor.yaml"}


def _kubernetes_validate():
    return pytest.importorskip(
        "kubernetes_validate.utils", reason="kubernetes-validate is not installed (see noxfile.py's test tools)"
    )


def _port(address: str) -> int:
    return int(str(address).rsplit(":", 1)[1])


def _versions() -> list[str]:
    try:
        from kubernetes_validate.utils import latest_version
    except ImportError:
        return [OLDEST_KUBERNETES]
    return [OLDEST_KUBERNETES, ".".join(latest_version().split(".")[:2])]


@pytest.mark.parametrize("version", _versions())
def test_every_manifest_validates_strictly(manifests, version):
    kv = _kubernetes_validate()
    checked, errors = [], []
    for name, docs in manifests.items():
        if name in RUNTIME_ONLY:
            continue
        for doc in docs:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                errors.append(f"{name}: {doc['kind']} (Kubernetes {version}) at {path}: {exc.message}")
            checked.append(doc["kind"])
    assert not errors, "\n".join(errors)
    assert sorted(checked) == ["Deployment", "HorizontalPodAutoscaler", "Service"]


def test_the_schema_check_catches_mistakes(deployment):
    """The validation above can fail: a misspelt field, a named port in a gRPC probe (it takes a
    number) and a string where an integer belongs are each refused."""
    kv = _kubernetes_validate()
    kv.validate(deployment, OLDEST_KUBERNETES, strict=True)
    for mistake in ("misspelt", "named grpc port", "string grace period"):
        broken = copy.deepcopy(deployment)
        pod = broken["spec"]["template"]["spec"]
        if mistake == "misspelt":
            pod["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/v2/health/ready"
        elif mistake == "named grpc port":
            pod["containers"][0]["startupProbe"]["grpc"]["port"] = "grpc"
        else:
            pod["terminationGracePeriodSeconds"] = "45"
        with pytest.raises(kv.ValidationError):
            kv.validate(broken, OLDEST_KUBERNETES, strict=True)


def test_the_kustomization_lists_every_manifest(manifests, container):
    (kustomization,) = manifests["kustomization.yaml"]
    assert kustomization["kind"] == "Kustomization"
    plain = {name for name in manifests if "/" not in name and name != "kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(plain)
    images = {image["name"] for image in kustomization.get("images", [])}
    assert container["image"].rsplit(":", 1)[0] in images, "kustomization.yaml's images must rename the container's"


def test_probe_service_and_scrape_ports_are_the_served_ones(deployment, container, serve_args, one_of, manifests):
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    served = {"grpc": _port(serve_args["--grpc"]), "http": _port(serve_args["--http"])}
    served["metrics"] = _port(serve_args["--metrics"])
    assert ports == served, "containerPort names and numbers must be the ports `embedtriton serve` is given"
    for option in ("--grpc", "--http", "--metrics"):
        host = serve_args[option].rsplit(":", 1)[0]
        assert host in {"0.0.0.0", "[::]"}, f"{option} must listen on the pod's addresses, not {host}"

    def resolve(port):
        return ports[port] if isinstance(port, str) else port

    for kind in ("startupProbe", "livenessProbe"):
        probe = container[kind]["grpc"]
        assert resolve(probe["port"]) == served["grpc"] and probe.get("service", "") == ""
    ready = container["readinessProbe"]["httpGet"]
    assert resolve(ready["port"]) == served["http"] and ready["path"] == "/v2/health/ready"

    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = one_of("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    targets = {p["name"]: (p["port"], resolve(p["targetPort"])) for p in service["spec"]["ports"]}
    assert targets == {name: (port, port) for name, port in served.items()}
    grpc_port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert grpc_port["appProtocol"] in {"kubernetes.io/h2c", "grpc"}

    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == served["metrics"]
    (monitor,) = manifests["monitoring/podmonitor.yaml"]
    assert monitor["kind"] == "PodMonitor" and monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert resolve(endpoint["port"]) == served["metrics"] and endpoint["path"] == annotations["prometheus.io/path"]

    hpa = one_of("HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count; `replicas` would reset it"


def test_the_grace_period_covers_the_drain(deployment, serve_args, prestop_sleep):
    """Kubelet's clock starts before the preStop hook: the sleep, then --exit-timeout for the
    requests in flight, then a margin for Triton to unload and stop, all before SIGKILL."""
    assert "--exit-timeout" in serve_args, "give --exit-timeout explicitly, so the grace period can be matched to it"
    exit_timeout = int(serve_args["--exit-timeout"])
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert prestop_sleep >= 1, "a preStop sleep keeps serving while the endpoint removal propagates"
    assert grace >= prestop_sleep + exit_timeout + 5, (grace, prestop_sleep, exit_timeout)


def _adapter_rule(manifests) -> dict:
    (values,) = manifests["monitoring/prometheus-adapter-values.yaml"]
    (rule,) = values["rules"]["custom"]
    return rule


def test_the_adapter_rule_serves_the_hpa_metric_per_pod(manifests, one_of):
    rule = _adapter_rule(manifests)
    (metric,) = one_of("HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["target"]["type"] == "AverageValue"
    assert metric["pods"]["metric"]["name"] == rule["name"]["as"]
    overrides = rule["resources"]["overrides"]
    assert overrides["pod"]["resource"] == "pod" and overrides["namespace"]["resource"] == "namespace"
    query = rule["metricsQuery"]
    assert query.count("<<.LabelMatchers>>") == 2 and query.count("by (<<.GroupBy>>)") == 2
    assert re.fullmatch(rule["name"]["matches"], re.match(r"\w+", rule["seriesQuery"]).group(0))


def _bind_deploy_models():
    spec = importlib.util.spec_from_file_location("deploy_models", DEPLOY / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.bind


def _metric_types(text: str) -> dict[str, str]:
    types = dict(re.findall(r"^# TYPE (\w+) (\w+)$", text, re.M))
    samples = set(re.findall(r"^(\w+)[{ ]", text, re.M))
    return {name: kind for name, kind in types.items() if name in samples}


def _sample(text: str, name: str, model: str) -> int:
    found = re.search(rf'^{name}\{{model="{re.escape(model)}",[^}}]*\}} (\d+)$', text, re.M)
    assert found, f"no {name} sample for model {model}"
    return int(found.group(1))


def _quantity(value) -> float:
    """A Kubernetes quantity as a number (the plain and decimal-suffix forms an HPA target uses)."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)(m|k|M|G)?", str(value))
    assert found, f"unexpected quantity {value!r}"
    return float(found.group(1)) * {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}[found.group(2)]


def test_the_autoscaling_metrics_exist_in_a_real_server(manifests, deployment, one_of):
    """Every metric the adapter rule reads is exported by a real server serving deploy/models.py
    (scraped over HTTP at the annotated path), as a counter (increase() needs one); the rule's
    quotient is what the HPA target assumes, microseconds of queue time per request; and the
    target is above the batching delay the models ask Triton for (else the HPA never rests)."""
    from embedtriton import Server

    rule = _adapter_rule(manifests)
    wanted = set(re.findall(r"\b(nv_\w+)\{", rule["seriesQuery"] + "\n" + rule["metricsQuery"]))
    assert {"nv_inference_queue_duration_us", "nv_inference_request_success"} <= wanted, wanted
    path = deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"]
    server = Server()
    _bind_deploy_models()(server)
    with server:
        port = server.serve_metrics("127.0.0.1:0")

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
                return reply.read().decode()

        (model,) = server.models()
        inputs = {i["name"]: np.ones((1, 16), np.float32) for i in model.metadata()["inputs"]}
        before, queued_ns = scrape(), model.statistics()["inference_stats"]["queue"]["ns"]
        for _ in range(4):
            model.infer(inputs)
        after, queued_ns = scrape(), model.statistics()["inference_stats"]["queue"]["ns"] - queued_ns
        in_process = server.metrics()
        delays = [
            m.config().get("dynamic_batching", {}).get("max_queue_delay_microseconds", 0) for m in server.models()
        ]
    (metric,) = one_of("HorizontalPodAutoscaler")["spec"]["metrics"]
    target_us = _quantity(metric["pods"]["target"]["averageValue"])
    assert target_us >= 10 * max(int(d) for d in delays), (target_us, delays)
    for text in (after, in_process):
        types = _metric_types(text)
        missing = wanted - types.keys()
        assert not missing, f"metrics the adapter rule needs are not exported: {sorted(missing)}"
        assert {types[name] for name in wanted} == {"counter"}, {name: types[name] for name in wanted}
    requests = _sample(after, "nv_inference_request_success", model.name)
    requests -= _sample(before, "nv_inference_request_success", model.name)
    queued_us = _sample(after, "nv_inference_queue_duration_us", model.name)
    queued_us -= _sample(before, "nv_inference_queue_duration_us", model.name)
    assert requests == 4
    assert abs(queued_us - queued_ns / 1000) <= 4, (queued_us, queued_ns)  # µs, as the HPA's target assumes


def _dockerfile() -> list[list[tuple[str, str]]]:
    """deploy/Dockerfile's stages, each a list of (INSTRUCTION, arguments); continuation lines
    joined, comments dropped. The ARGs before the first FROM are a stage of their own."""
    lines = [line for line in (DEPLOY / "Dockerfile").read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    stages: list[list[tuple[str, str]]] = [[]]
    for found in re.finditer(r"^(\w+)\s+(.*)$", joined, re.M):
        instruction = found.group(1).upper()
        if instruction == "FROM":
            stages.append([])
        stages[-1].append((instruction, found.group(2).strip()))
    return stages


def _all(instructions, name: str) -> list[str]:
    return [args for instruction, args in instructions if instruction == name]


def test_the_dockerfile_runs_what_the_deployment_expects(container, serve_args, deployment):
    preamble, *stages = _dockerfile()
    assert len(stages) >= 2, "build the wheel (with gcc) in a stage of its own"
    runtime = stages[-1]
    defaults = dict(arg.split("=", 1) for arg in _all(preamble, "ARG") if "=" in arg)
    base = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], _all(runtime, "FROM")[0].split()[0])
    assert re.fullmatch(r"python:3\.\d+-slim-\w+", base), f"the runtime needs a glibc-based slim Python, not {base}"
    assert "gcc" not in " ".join(_all(runtime, "RUN")), "the compiler stays in the build stage"

    (entrypoint,) = _all(runtime, "ENTRYPOINT")
    assert json.loads(entrypoint)[-2:] == ["embedtriton", "serve"]
    assert "command" not in container, "a `command` would replace the image's ENTRYPOINT"
    (expose,) = _all(runtime, "EXPOSE")
    assert {int(p) for p in expose.split()} == {p["containerPort"] for p in container["ports"]}
    assert _all(runtime, "STOPSIGNAL") == ["SIGTERM"]
    (user,) = _all(runtime, "USER")
    uid = user.split(":")[0]
    assert uid not in {"0", "root"}
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)

    (cmd,) = _all(runtime, "CMD")
    image_args = json.loads(cmd)
    for option in ("--grpc", "--http", "--metrics"):
        assert image_args[image_args.index(option) + 1] == serve_args[option]

    pinned = re.search(r'^TRITON_RUNTIME = "([^"]+)"', (ROOT / "noxfile.py").read_text(), re.M).group(1)
    installs = [shlex.split(run) for run in _all(runtime, "RUN") if pinned in run]
    assert any("--no-deps" in words for words in installs), f"install {pinned} with --no-deps, as noxfile.py does"


def test_the_image_holds_the_models_module_the_args_name(serve_args):
    preamble, *stages = _dockerfile()
    module, attr = serve_args["target"].split(":")
    runtime = stages[-1]
    workdir = _all(runtime, "WORKDIR")[-1].rstrip("/")
    placed = {}
    for args in _all(runtime, "COPY"):
        *sources, dest = args.split()
        if not args.startswith("--from") and len(sources) == 1:
            placed[dest if dest.startswith("/") else f"{workdir}/{dest.removeprefix('./')}"] = sources[0]
    source = placed.get(f"{workdir}/{module}.py")
    assert source, f"no COPY puts {module}.py in {workdir}: {placed}"
    tree = ast.parse((ROOT / source).read_text())
    assert attr in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}

    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:] for line in ignore if line.startswith("!")}
    for stage in stages:
        for args in _all(stage, "COPY"):
            if args.startswith("--from"):
                continue
            for src in args.split()[:-1]:
                assert (ROOT / src).exists(), f"COPY {src}: no such file in the repository"
                assert src.rstrip("/") in allowed, f"COPY {src}: Dockerfile.dockerignore keeps it out of the context"
