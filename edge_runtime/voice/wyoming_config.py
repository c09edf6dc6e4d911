"""`WyomingConfig`: the Wyoming server's settings (the `wyoming:` mapping of the voice config,
`--wyoming HOST:PORT` on the command line), and the listen address's parsing.

Wyoming has no authentication: whoever reaches the port can transcribe, speak and run the home's
actions. So an address without a host (`10300`, `:10300`) binds to loopback only; any other host
must be named (`0.0.0.0:10300`, `192.168.1.20:10300`, `[::]:10300`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from edge_runtime.errors import ConfigError
from edge_runtime.voice import setting_checks as check

LOOPBACK = "127.0.0.1"
MAX_CONNECTIONS = 1024  # each is a socket and two small tasks; more is a typo
MAX_IDLE_S = 86400.0
MAX_AUDIO_S = 600.0


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
    """`HOST:PORT`, `[IPV6]:PORT`, `:PORT` or `PORT` -> (host, port); no host is loopback."""
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{what} must be HOST:PORT (e.g. 127.0.0.1:10300), got {text!r}")
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host, port = "", text.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"{what} {text!r}: write an IPv6 address in brackets, e.g. [::1]:10300")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} {text!r}: the port must be a number from 0 to 65535")
    if host and not _is_host(host):
        raise ConfigError(f"{what} {text!r}: {host!r} is not an IP address or host name")
    return host or LOOPBACK, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
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
