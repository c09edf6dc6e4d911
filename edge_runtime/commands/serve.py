"""`edge-runtime serve`: the OpenAI-compatible API over a Unix socket, and over TCP when asked
(docs/service.md).

Under systemd the listening sockets come from socket activation (LISTEN_FDS: the Unix socket and,
when the socket unit has one, a TCP socket) and --socket/--listen are not bound; otherwise
--socket, else the budget's service.socket, is created with mode 0660, and --listen, else
service.listen, is bound when given. API keys (--api-keys, else service.api_keys) are read
before anything binds; a non-loopback TCP address without them refuses to start.
"""

from __future__ import annotations

import argparse
import os
from pathlib import PurePath

from edge_runtime.engine.placement import add_arguments as add_placement_arguments
from edge_runtime.errors import ConfigError
from edge_runtime.model.weights_option import add_weights_option
from edge_runtime.paths import check_unix_socket_path
from edge_runtime.listen_address import bind_tcp_socket, check_exposure, parse_listen, tcp_host
from edge_runtime.service.sd_notify import SystemdNotifier
from edge_runtime.service.sections import load_sections
from edge_runtime.service.socket_activation import activated_sockets


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve the OpenAI-compatible API on a Unix socket (and TCP if asked)",
        description="Load the model once and serve /v1/completions, /v1/chat/completions, "
                    "/v1/models, /health, /metrics and /v1/stats over a Unix socket, and over "
                    "TCP with --listen (or the sockets systemd passes). SIGTERM drains "
                    "in-flight requests.")
    p.add_argument("--config", help="budget YAML (configs/orin/*.yaml): service:, guard: and "
                                    "the memory plan")
    p.add_argument("--model", default=None, help="model name or path "
                                                 "(default: smollm2-135m-instruct)")
    p.add_argument("--socket", help="Unix socket path (default: the budget's service.socket)")
    p.add_argument("--listen", metavar="HOST:PORT",
                   help="also serve over TCP (default: the budget's service.listen; off). "
                        "Loopback (127.0.0.1, [::1], localhost) needs no key; any other address "
                        "needs --api-keys")
    p.add_argument("--api-keys", metavar="FILE",
                   help="file of API keys, one a line, mode 0600 (default: the budget's "
                        "service.api_keys); then every TCP request needs "
                        "'Authorization: Bearer KEY', on loopback too")
    add_placement_arguments(p)
    add_weights_option(p)
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from edge_runtime.service.app import ServiceState  # optional library: aiohttp
    from edge_runtime.service.engine_setup import load_all  # optional library: aiohttp
    from edge_runtime.service.server import Server  # optional library: aiohttp

    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    limits, guard_config = load_sections(args.config)
    model = args.model or _default_model()
    keys = _api_keys(args, limits)
    socks, owns = _listening_sockets(args, limits, has_keys=keys is not None)
    state = ServiceState(limits, _served_name(model))
    state.api_keys = keys

    def loader():
        return load_all(model, args.config, limits, guard_config, args.device, args.backend,
                        args.weights)

    server = Server(state, socks, loader, SystemdNotifier(), owns_path=owns)
    return asyncio.run(server.run())


def _listening_sockets(args: argparse.Namespace, limits, has_keys: bool):
    """([Unix socket, TCP socket if any], the socket file to remove at exit or None): passed by
    systemd, else bound here; a non-loopback TCP address without keys refuses before any bind."""
    from edge_runtime.service.server import bind_unix_socket  # optional library: aiohttp

    listen, listen_flag = _listen_option(args, limits)
    activated = activated_sockets()
    if activated is not None:
        sock, tcp = activated
        if tcp is None and listen is not None:
            raise ConfigError(f"{listen_flag} {listen} is set, but systemd passed no TCP socket: "
                              f"add ListenStream={listen} to edge-runtime.socket "
                              "(tools/install-service.sh --listen), or unset it")
        if tcp is None:
            return [sock], None
        check_exposure(tcp_host(tcp), has_keys, "the TCP socket systemd passed")
        return [sock, tcp], None
    if listen is not None:
        check_exposure(listen.host, has_keys, f"{listen_flag} {listen}")
    owns = args.socket or limits.socket
    flag = "--socket" if args.socket else "service.socket"
    check_unix_socket_path(owns, flag)
    sock = bind_unix_socket(owns, flag)
    if listen is None:
        return [sock], owns
    try:
        tcp = bind_tcp_socket(listen, listen_flag)
    except ConfigError:
        sock.close()
        os.unlink(owns)
        raise
    return [sock, tcp], owns


def _listen_option(args: argparse.Namespace, limits):
    """(ListenAddress or None, the flag that named it)."""

    if args.listen is not None:
        return parse_listen(args.listen, "--listen"), "--listen"
    if limits.listen:
        return parse_listen(limits.listen, "service.listen"), "service.listen"
    return None, ""


def _api_keys(args: argparse.Namespace, limits):
    """ApiKeys from --api-keys, else service.api_keys; None when neither is set."""
    from edge_runtime.service.api_keys import load_api_keys  # optional library: aiohttp

    if args.api_keys is not None:
        return load_api_keys(args.api_keys, "--api-keys")
    if limits.api_keys:
        return load_api_keys(limits.api_keys, "service.api_keys")
    return None


def _default_model() -> str:
    from edge_runtime.model.loader import DEFAULT_MODEL  # start-up time: imports numpy, torch

    return DEFAULT_MODEL


def _served_name(model: str) -> str:
    """The id clients send as "model": the built-in name, or the file/folder name of a path."""
    name = PurePath(model).name
    return name[:-5] if name.endswith(".gguf") else name
