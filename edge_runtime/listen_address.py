"""The optional TCP listener of the API: its HOST:PORT, the loopback rule, and binding it.

The Unix socket is for clients on the same box; Home Assistant's conversation integrations and
other hosts need HTTP over TCP. The TCP listener is off unless `--listen` or `service.listen`
names an address (or systemd passes a TCP socket), and it serves the same application, limits
and connection cap as the Unix socket (connections.start_listening).

Invariants:
- An address is an IP literal or `localhost` (127.0.0.1), never a name to resolve: what is
  exposed is decided from the text alone, without DNS.
- Loopback (127.0.0.0/8, ::1, an IPv4-mapped loopback, localhost) may listen without API keys;
  any other address is refused before a socket exists unless API keys are configured
  (`check_exposure`). With keys, every TCP request needs one, loopback included (api_keys.py).
- A bind failure is a one-line ConfigError naming the flag, as for the Unix socket.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from dataclasses import dataclass

from edge_runtime.errors import ConfigError

_FORMS = ("give HOST:PORT with an IP address or localhost, e.g. 127.0.0.1:8080, "
          "0.0.0.0:8080 or [::1]:8080")


@dataclass(frozen=True)
class ListenAddress:
    host: str  # an IP literal (localhost already replaced by 127.0.0.1)
    port: int  # 0: the kernel picks a free port

    @property
    def family(self) -> int:
        return socket.AF_INET6 if ":" in self.host else socket.AF_INET

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.host)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if self.family == socket.AF_INET6 \
            else f"{self.host}:{self.port}"


def parse_listen(text: str, flag: str = "--listen") -> ListenAddress:
    """HOST:PORT (IPv6 in brackets) -> ListenAddress; a ConfigError naming `flag` otherwise."""
    host, port = split_host_port(text, flag, _FORMS)
    if host.lower() == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: {host!r} is not an IP address (names are not "
                          f"resolved: what is exposed must not depend on DNS); {_FORMS}") from None
    if address.version == 6 and address.scope_id:
        raise ConfigError(f"{flag} {text!r}: scoped IPv6 addresses are not supported; {_FORMS}")
    return ListenAddress(str(address), port)


def split_host_port(text: str, flag: str, forms: str, host_optional: bool = False
                    ) -> tuple[str, int]:
    """`HOST:PORT` or `[IPV6]:PORT` -> (host without brackets, port 0-65535); with
    `host_optional`, `:PORT` and `PORT` too (host ""). The host is not checked. Every refusal is
    a ConfigError starting with `flag` and the text, ending with `forms` (what to give)."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep and host_optional:
        host, port_text = "", text.strip()
    elif not sep or not (host or host_optional):
        raise ConfigError(f"{flag} {text!r}: no port; {forms}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"{flag} {text!r}: an IPv6 address goes in brackets; {forms}")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"{flag} {text!r}: the port must be a number from 0 to 65535; {forms}")
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or an IPv4-mapped loopback address; `host` is an IP literal (a
    ValueError otherwise)."""
    address = ipaddress.ip_address(host)
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def check_exposure(host: str, has_keys: bool, where: str) -> None:
    """Refuse a listener on a non-loopback address without API keys (before anything binds)."""
    if not has_keys and not is_loopback(host):
        raise ConfigError(
            f"{where} listens on {host}, which is not a loopback address: anyone who can reach it "
            "could use the model. Give API keys (--api-keys FILE or service.api_keys: a file only "
            "the service's user can read, one key per line; docs/service.md), or listen on "
            "127.0.0.1")


def bind_tcp_socket(address: ListenAddress, flag: str = "--listen",
                    backlog: int = 1024) -> socket.socket:
    """A listening TCP socket at `address` (SO_REUSEADDR, so a restart need not wait out
    TIME_WAIT); every OS error is a ConfigError naming `flag` and the address."""
    sock = socket.socket(address.family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address.host, address.port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"{flag} {address}: cannot listen ({exc.strerror or exc}); choose "
                          "another address or port") from None
    return sock


def tcp_host(sock: socket.socket) -> str:
    """The IP address a listening TCP socket is bound to."""
    return sock.getsockname()[0]


def describe(sock: socket.socket) -> str:
    """What a listening socket is, for the start-up line: a path, or http://HOST:PORT."""
    with contextlib.suppress(OSError):
        name = sock.getsockname()
        if sock.family == socket.AF_INET6:
            return f"http://[{name[0]}]:{name[1]}"
        if sock.family == socket.AF_INET:
            return f"http://{name[0]}:{name[1]}"
        return name or "fd 3"
    return "a socket"
