"""``realtime-omni``: the command line."""

from __future__ import annotations

import argparse
import logging
import sys

from . import config as config_mod


def _serve(args: argparse.Namespace) -> int:
    from .app import create_app
    from .runner import RealtimeUvicorn, uvicorn_config
    from .server import Server

    cfg = config_mod.load(args.config, host=args.host, port=args.port, api_key=args.api_key)
    server = Server(cfg)
    RealtimeUvicorn(uvicorn_config(create_app(server), server, args.log_level), server).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="realtime-omni", description="Real-time voice agent server (OpenAI Realtime API).")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server")
    serve.add_argument("--config", default=config_mod.DEFAULT_CONFIG, help="config name (configs/<name>.yaml) or path")
    serve.add_argument("--host", default=None, help="bind address (default from config: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default from config: 8000)")
    serve.add_argument("--api-key", default=None, help="require this key (also REALTIME_OMNI_API_KEY)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(func=_serve)

    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper() if hasattr(args, "log_level") else "INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
