"""``embedtriton serve module:attr`` — bind models and serve them until interrupted;
``embedtriton serve --model-repository DIR`` — serve a Triton model repository, as
``tritonserver --model-repository DIR`` does (both may be given);
``embedtriton tune module:attr --model NAME`` — sweep Triton's batcher settings for one of them;
``embedtriton install-runtime`` — install the Triton runtime (nvidia-pytriton, without its numpy<2 pin);
``embedtriton doctor`` — report the platform, wheel, runtime, GPUs and extras found.

``attr`` is a function that takes a :class:`embedtriton.Server` and binds models on it.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

from . import __version__, doctor
from .backend import library
from .config import ServerConfig
from .errors import TritonError
from .frontends.grpc import GrpcLimits
from .frontends.security import GROUPS, HTTP_GROUPS, RestrictedApis, forward_pattern
from .frontends.security import GRPC_HEADER_PREFIX as GRPC_PREFIX
from .server import Server


class _DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default; an empty address as 'none'."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help = super()._get_help_string(action)
        return help.replace("%(default)s", "none") if help and action.default == "" else help


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="embedtriton", description=__doc__)
    defaults = _DefaultsShown
    parser.add_argument("--version", action="version", version=f"embedtriton {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="bind models with module:attr and serve them", formatter_class=defaults)
    serve.add_argument(
        "target",
        nargs="?",
        help="module:function that binds models on the Server it is given (optional with --model-repository)",
    )
    serve.add_argument(
        "--model-repository",
        action="append",
        default=[],
        help="a Triton model repository folder to serve (repeatable), as tritonserver's option",
    )
    serve.add_argument(
        "--model-control-mode",
        choices=["none", "explicit", "poll"],
        default="none",
        help="tritonserver's option: 'none' (its default) loads every --model-repository model at start and "
        "refuses network load/unload (UNAVAILABLE, HTTP 503); 'explicit' lets gRPC and HTTP clients load and "
        "unload models (repository models load on request only); 'poll' is 'none' and watches the folders",
    )
    serve.add_argument("--repository-poll-secs", type=float, default=15.0, help="with --model-control-mode poll")
    serve.add_argument("--grpc", default="127.0.0.1:8001", help="gRPC address ('' for none)")
    serve.add_argument(
        "--metrics",
        default="",
        help="a port of its own for Prometheus /metrics, e.g. 127.0.0.1:8002 ('': none; --http serves /metrics too)",
    )
    serve.add_argument("--http", default="", help="KServe-v2 HTTP/REST address, e.g. 127.0.0.1:8000 ('': none)")
    serve.add_argument("--tls-cert", help="PEM certificate: serve gRPC (and HTTP) over TLS (with --tls-key)")
    serve.add_argument("--tls-key", help="PEM private key of --tls-cert")
    serve.add_argument("--tls-client-ca", help="PEM CA: require client certificates signed by it")
    serve.add_argument("--max-message-bytes", type=int, default=64 * 1024 * 1024, help="gRPC message size cap")
    serve.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        help="open connections at most (per endpoint; fewer if the descriptor limit is lower)",
    )
    serve.add_argument("--idle-timeout", type=float, default=300.0, help="seconds before an idle connection is closed")
    serve.add_argument(
        "--max-buffered-bytes",
        type=int,
        default=512 * 1024 * 1024,
        help="request bytes each endpoint holds across its connections (beyond: HTTP 503, gRPC RESOURCE_EXHAUSTED)",
    )
    serve.add_argument(
        "--no-shared-memory",
        action="store_true",
        help="refuse system shared memory (clients could name any /dev/shm object the server can open)",
    )
    serve.add_argument(
        "--grpc-infer-response-compression-level",
        choices=["none", "low", "medium", "high"],
        default="none",
        help="compress inference responses for clients that accept gzip/deflate (as Triton's option)",
    )
    serve.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="GROUPS:HEADER=VALUE",
        help="Triton's option: gRPC calls to these groups (comma-separated: " + ", ".join(GROUPS) + ") need "
        "the metadata triton-grpc-protocol-HEADER: VALUE, else UNAVAILABLE; repeatable, a group in one only",
    )
    serve.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="GROUPS:HEADER=VALUE",
        help="Triton's option: HTTP requests to these groups (Triton's, and openai for the /v1/ routes) need "
        "the header HEADER: VALUE, else 403; repeatable",
    )
    serve.add_argument(
        "--grpc-header-forward-pattern",
        metavar="REGEX",
        help="gRPC metadata whose key this regex finds (ignoring case) reaches models as request parameters",
    )
    serve.add_argument(
        "--http-header-forward-pattern",
        metavar="REGEX",
        help="HTTP headers whose name this regex finds (ignoring case) reach models as request parameters",
    )
    serve.add_argument(
        "--openai",
        action="store_true",
        help="also answer OpenAI's routes (/v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings) on "
        "the --http port, for models bound with embedtriton.openai",
    )
    serve.add_argument(
        "--openai-api-key",
        metavar="KEY",
        help="with --openai: those routes need 'Authorization: Bearer KEY' (default: $EMBEDTRITON_OPENAI_API_KEY)",
    )
    serve.add_argument(
        "--exit-timeout",
        type=int,
        default=30,
        help="seconds that requests in flight get to finish after SIGINT/SIGTERM",
    )
    tune = commands.add_parser(
        "tune", help="bind models with module:attr and tune one model's batching config", formatter_class=defaults
    )
    tune.add_argument("target", help="module:function that binds models on the Server it is given")
    tune.add_argument("--model", required=True, help="the model to tune")
    tune.add_argument("--concurrency", default="1,8,32", help="requests in flight to measure at")
    tune.add_argument("--latency-budget-ms", type=float, help="the p99 latency the chosen config must keep")
    tune.add_argument("--time-budget-s", type=float, default=120.0, help="when to stop searching")
    tune.add_argument("--window-s", type=float, default=1.0, help="seconds each measurement lasts")
    tune.add_argument("--shape", action="append", default=[], help="NAME=D1[,D2..]: a variable input's dims")
    tune.add_argument("--samples", help=".npz with one array per input (first axis: samples) instead of random data")
    tune.add_argument("--via", choices=["in-process", "grpc"], default="in-process", help="how load is sent")
    tune.add_argument("--cache-bytes", type=int, default=0, help="give the server a response cache of this size")
    tune.add_argument(
        "--output",
        default="tuning-report",
        help="folder that report.json, best_config.py and report.png are written to (relative: to the current folder)",
    )
    doctor.add_commands(commands)
    args = parser.parse_args(argv)
    if hasattr(args, "run"):  # doctor, install-runtime: nothing to bind or load first
        return int(args.run(args))
    if args.command == "serve" and (problem := _security_problem(args)):
        parser.error(problem)  # before anything is imported or bound

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("embedtriton")
    if args.target is None and not getattr(args, "model_repository", None):
        parser.error("name what to serve: a module:function that binds models, or --model-repository DIR (or both)")
    bind = _load_target(parser, args.target) if args.target else _no_bind

    try:  # the native module and Triton's runtime, before anything is bound
        library.native()
    except (ImportError, TritonError) as exc:
        print(f"embedtriton {args.command}: {exc}", file=sys.stderr)
        return 1
    if args.command == "tune":
        log.setLevel(logging.WARNING)  # each trial reloads the model: its INFO lines would break the progress bar
        config = ServerConfig(cache_config=[f"local,size={args.cache_bytes}"] if args.cache_bytes else [])
    else:
        config = ServerConfig(exit_timeout_secs=args.exit_timeout, model_control_mode=args.model_control_mode)
        if args.model_repository:
            config.model_repository = list(args.model_repository)
            config.repository_poll_secs = args.repository_poll_secs
    try:
        server = Server(config)
    except TritonError as exc:
        print(f"embedtriton {args.command}: {exc}", file=sys.stderr)
        return 2
    interrupted = []

    def while_binding(signum: int, frame: object) -> None:
        interrupted.append(signum)
        raise KeyboardInterrupt

    # SIGTERM as SIGINT while binding: handled (PID 1 in a container, without an init, has no
    # default action for it: the kernel would drop the signal and the pod bind on)
    default_term = signal.signal(signal.SIGTERM, while_binding)
    try:
        bind(server)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM while binding: stop before any port opens
        log.info("interrupted while binding models; nothing was served")
        return 128 + (interrupted[0] if interrupted else signal.SIGINT)
    except TritonError as exc:  # a bad declaration: the message says what to fix
        print(f"embedtriton {args.command}: {args.target}: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, default_term)
    if args.command == "tune":
        try:
            return _tune(server, args)
        except TritonError as exc:
            print(f"embedtriton tune: {exc}", file=sys.stderr)
            return 2

    # SIGINT/SIGTERM drain (new requests are refused, those in flight finish within
    # --exit-timeout); a second one exits at once.
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            log.warning("%s again: exiting without waiting for requests in flight", name)
            logging.shutdown()
            os._exit(128 + signum)
        log.info(
            "%s: stopping; requests in flight get up to %s s (a second signal exits at once)", name, args.exit_timeout
        )
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    try:
        return _serve(server, args, stop, log)
    except TritonError as exc:  # e.g. the port is in use: one line, not a traceback
        print(f"embedtriton serve: {exc}", file=sys.stderr)
        return 1


def _no_bind(server: Server) -> None:
    """What ``serve`` binds when only repositories are served: nothing."""


def _load_target(parser: argparse.ArgumentParser, target: str) -> Callable[[Server], object]:
    """The bind function that ``module:function`` names (the usage error if it cannot be used)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        parser.error(f"target must look like module:function, not {target!r}")
    sys.path.insert(0, "")
    try:
        bind = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        parser.error(f"cannot load {target}: {exc}")
    problem = _bind_problem(bind)
    if problem:
        parser.error(
            f"{target} {problem}; it must be a function that takes the Server and binds models:\n"
            "    def bind(server):\n        server.bind('Name', infer_func, inputs=[...], outputs=[...])"
        )
    return bind


def _security_problem(args: argparse.Namespace) -> str:
    """Why the restriction and header-forwarding flags cannot be used, or '' (checked before
    any model is bound, in Triton's words)."""
    for endpoint, on, flags in (
        ("gRPC", args.grpc, ("grpc_restricted_protocol", "grpc_header_forward_pattern")),
        ("HTTP", args.http, ("http_restricted_api", "http_header_forward_pattern", "openai")),
    ):
        for flag in flags:
            if getattr(args, flag) and not on:
                option = "--" + flag.replace("_", "-")
                return f"{option} applies to the {endpoint} endpoint, which is off: add --{endpoint.lower()} HOST:PORT"
    if args.openai_api_key and not args.openai:
        return "--openai-api-key applies to the OpenAI routes, which are off: add --openai"
    try:
        RestrictedApis(
            args.grpc_restricted_protocol, option="grpc-restricted-protocol", noun="protocol", header_prefix=GRPC_PREFIX
        )
        RestrictedApis(args.http_restricted_api, option="http-restricted-api", noun="api", extra_groups=HTTP_GROUPS)
        forward_pattern(args.grpc_header_forward_pattern, "--grpc-header-forward-pattern")
        forward_pattern(args.http_header_forward_pattern, "--http-header-forward-pattern")
    except TritonError as exc:
        return str(exc)
    return ""


def _bind_problem(bind: object) -> str:
    """Why ``bind`` cannot be called with the Server, or ''."""
    if not callable(bind):
        return f"is a {type(bind).__name__}, not a function"
    try:
        inspect.signature(bind).bind(None)
    except TypeError:
        return f"takes {inspect.signature(bind)}, not one argument (the Server)"
    except ValueError:  # no signature to read (a builtin): let the call tell
        pass
    return ""


_FLAGS = {"gRPC": "--grpc", "HTTP": "--http", "metrics": "--metrics"}


def _with_hint(exc: TritonError) -> TritonError:
    """An endpoint that could not open its port, with the flag that picks another."""
    message = str(exc)
    for endpoint, flag in _FLAGS.items():
        if message.startswith(f"cannot serve {endpoint} on ") and ("in use" in message or "in Use" in message):
            return type(exc)(
                f"{message} (another process, perhaps another `embedtriton serve`, holds that port: "
                f"pick another with {flag} HOST:PORT, or {flag} '' for none)"
            )
    return exc


def _serve(server: Server, args: argparse.Namespace, stop: threading.Event, log: logging.Logger) -> int:
    try:
        return _serve_endpoints(server, args, stop, log)
    except TritonError as exc:
        raise _with_hint(exc) from None


def _serve_endpoints(server: Server, args: argparse.Namespace, stop: threading.Event, log: logging.Logger) -> int:
    with server:
        names = [m.name for m in server.models()]
        if args.grpc and not stop.is_set():
            server.serve_grpc(  # it logs where it serves
                args.grpc,
                max_message_bytes=args.max_message_bytes,
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                tls_client_ca=args.tls_client_ca,
                limits=GrpcLimits(max_connections=args.max_connections, idle_timeout_s=args.idle_timeout),
                shared_memory=not args.no_shared_memory,
                infer_response_compression_level=args.grpc_infer_response_compression_level,
                restricted_protocol=args.grpc_restricted_protocol,
                header_forward_pattern=args.grpc_header_forward_pattern,
                max_buffered_bytes=args.max_buffered_bytes,
            )
        if args.http and not stop.is_set():
            server.serve_http(  # it logs where it serves
                args.http,
                max_body_bytes=args.max_message_bytes,
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                tls_client_ca=args.tls_client_ca,
                max_connections=args.max_connections,
                idle_timeout_s=args.idle_timeout,
                shared_memory=not args.no_shared_memory,
                restricted_api=args.http_restricted_api,
                header_forward_pattern=args.http_header_forward_pattern,
                max_buffered_bytes=args.max_buffered_bytes,
                openai=args.openai,
                openai_api_key=(args.openai_api_key or os.environ.get("EMBEDTRITON_OPENAI_API_KEY") or None)
                if args.openai
                else None,
            )
        if args.metrics and not stop.is_set():
            port = server.serve_metrics(args.metrics)
            log.info("metrics on http://%s/metrics (port %d)", args.metrics, port)
        if not stop.is_set():
            log.info("ready: %s", ", ".join(names) or "no models")
        stop.wait()
        log.info("stopping")
    log.info("stopped")
    return 0


def _tune(server: Server, args: argparse.Namespace) -> int:
    from .tuning import tune
    from .tuning.load import parse_shapes, read_samples

    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        print(f"embedtriton tune: --concurrency {args.concurrency!r}: expected numbers like 1,8,32", file=sys.stderr)
        return 2
    shapes = parse_shapes(args.shape)
    samples = read_samples(args.samples) if args.samples else None
    with server:
        report = tune(
            server, args.model, concurrency=levels, latency_budget_ms=args.latency_budget_ms,
            time_budget_s=args.time_budget_s, shapes=shapes, samples=samples, via=args.via, window_s=args.window_s,
        )  # fmt: skip
    written = report.save(args.output)
    print(report.table())
    print()
    print(report.summary())
    for note in report.notes:
        print(f"note: {note}")
    print("written: " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
