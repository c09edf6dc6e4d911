"""`edge-runtime serve`: the OpenAI-compatible API over a Unix socket (docs/service.md).

Under systemd the listening socket comes from socket activation (LISTEN_FDS) and --socket is
ignored; otherwise --socket, else the budget's service.socket, is created with mode 0660.
"""

from __future__ import annotations

import argparse

from edge_runtime.engine.placement import add_arguments as add_placement_arguments
from edge_runtime.model.weights_option import add_weights_option
from edge_runtime.paths import check_unix_socket_path
from edge_runtime.service.sd_notify import SystemdNotifier
from edge_runtime.service.sections import load_sections
from edge_runtime.service.socket_activation import activated_unix_socket


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve the OpenAI-compatible API on a Unix socket",
        description="Load the model once and serve /v1/completions, /v1/chat/completions, "
                    "/v1/models, /health, /metrics and /v1/stats over a Unix socket "
                    "(or the socket systemd passes). SIGTERM drains in-flight requests.")
    p.add_argument("--config", help="budget YAML (configs/orin/*.yaml): service:, guard: and "
                                    "the memory plan")
    p.add_argument("--model", default=None, help="model name or path "
                                                 "(default: smollm2-135m-instruct)")
    p.add_argument("--socket", help="Unix socket path (default: the budget's service.socket)")
    add_placement_arguments(p)
    add_weights_option(p)
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from edge_runtime.service.app import ServiceState  # optional library: aiohttp
    from edge_runtime.service.engine_setup import load_all  # optional library: aiohttp
    from edge_runtime.service.server import Server, bind_unix_socket  # optional library: aiohttp

    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    limits, guard_config = load_sections(args.config)
    model = args.model or _default_model()
    sock, owns = activated_unix_socket(), None
    if sock is None:
        owns = args.socket or limits.socket
        flag = "--socket" if args.socket else "service.socket"
        check_unix_socket_path(owns, flag)
        sock = bind_unix_socket(owns, flag)
    state = ServiceState(limits, _served_name(model))

    def loader():
        return load_all(model, args.config, limits, guard_config, args.device, args.backend,
                        args.weights)

    server = Server(state, sock, loader, SystemdNotifier(), owns_path=owns)
    return asyncio.run(server.run())


def _default_model() -> str:
    from edge_runtime.model.loader import DEFAULT_MODEL  # start-up time: imports numpy, torch

    return DEFAULT_MODEL


def _served_name(model: str) -> str:
    """The id clients send as "model": the built-in name, or the file/folder name of a path."""
    from pathlib import PurePath

    name = PurePath(model).name
    return name[:-5] if name.endswith(".gguf") else name
