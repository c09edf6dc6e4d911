"""`WyomingConfig`: the Wyoming server's settings (the `wyoming:` mapping of the voice config,
`--wyoming HOST:PORT` on the command line), and the listen address's parsing.

Wyoming has no authentication: whoever reaches the port can transcribe, speak and run the home's
actions. So an address without a host (`10300`, `:10300`) binds to loopback only; any other host
must be named (`0.0.0.0:10300`, `192.168.1.20:10300`, `[::]:10300`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from edge_runtime import listen_address
from edge_runtime.errors import ConfigError
from edge_runtime.listen_address import split_host_port
from edge_runtime.voice import setting_checks as check

LOOPBACK = "127.0.0.1"
MAX_CONNECTIONS = 1024  # each is a socket and two small tasks; more is a typo
MAX_IDLE_S = 86400.0
MAX_AUDIO_S = 600.0
_FORMS = "give HOST:PORT, [IPV6]:PORT or PORT (loopback), e.g. 127.0.0.1:10300 or 0.0.0.0:10300"


@dataclass(frozen=True)
class WyomingConfig:
    listen: str | None = None  # HOST:PORT; None: no Wyoming server unless --wyoming names one
    max_connections: int = 16  # past it the idle-longest connection is closed for a newcomer
    idle_timeout_s: float = 300.0  # a connection that sends nothing this long is closed
    max_audio_s: float = 30.0  # audio of one `transcribe` request (Whisper's window)
    max_pending: int = 4  # a satellite's utterances waiting for their turn; more are dropped
    tts_voice: str = "en-us"  # espeak-ng voice when `synthesize` names none

    def __post_init__(self) -> None:
        if self.listen is not None:
            parse_listen(self.listen, "wyoming.listen")
        check.count("wyoming.max_connections", self.max_connections, 1, MAX_CONNECTIONS)
        check.number("wyoming.idle_timeout_s", self.idle_timeout_s, 0, MAX_IDLE_S, lo_open=True)
        check.number("wyoming.max_audio_s", self.max_audio_s, 1, MAX_AUDIO_S)
        check.count("wyoming.max_pending", self.max_pending, 1, 64)
        check.text("wyoming.tts_voice", self.tts_voice)


def parse_listen(text: object, what: str = "--wyoming") -> tuple[str, int]:
    """`HOST:PORT`, `[IPV6]:PORT`, `:PORT` or `PORT` -> (host, port); no host is loopback.
    The brackets and the port are listen_address.py's rules (the API's `--listen`); unlike it, a
    host name is accepted (Home Assistant setups name hosts; it is resolved when binding)."""
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{what} must be HOST:PORT (e.g. 127.0.0.1:10300), got {text!r}")
    host, port = split_host_port(text, what, _FORMS, host_optional=True)
    if host and not _is_host(host):
        raise ConfigError(f"{what} {text!r}: {host!r} is not an IP address or host name; {_FORMS}")
    return host or LOOPBACK, port


def is_loopback(host: str) -> bool:
    """listen_address.py's loopback rule (127.0.0.0/8, ::1, IPv4-mapped loopback) plus the name
    `localhost`; any other host name may resolve anywhere, so it counts as exposed."""
    if host.lower() == "localhost":
        return True
    try:
        return listen_address.is_loopback(host)
    except ValueError:
        return False


def _is_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        labels = host.rstrip(".").split(".")
        return all(label and len(label) <= 63 and label.replace("-", "").isalnum()
                   and not label.startswith("-") for label in labels)
