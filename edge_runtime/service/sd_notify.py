"""systemd notification protocol (sd_notify(3)) with the standard library only.

Invariants:
- Messages are newline-separated KEY=VALUE lines sent as ONE datagram to the AF_UNIX/SOCK_DGRAM
  address in $NOTIFY_SOCKET; a leading '@' names an abstract-namespace socket ('@' -> '\\0').
- Without $NOTIFY_SOCKET (not run by systemd) every call is a no-op that returns False, so the same
  code path runs under systemd, in a terminal and in tests.
- The watchdog is armed only when $WATCHDOG_USEC is set and $WATCHDOG_PID (if set) is our pid;
  `watchdog_ping()` is rate-limited to half the interval, so it can be called from every engine
  step without flooding systemd.
- `NOTIFY_SOCKET` is not removed from the environment: Python children (tests, bench helpers) are
  started with explicit environments.
"""

from __future__ import annotations

import os
import socket
import time


class SystemdNotifier:
    """Sends READY/STATUS/EXTEND_TIMEOUT/WATCHDOG/STOPPING to systemd, if it is listening."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address = _parse_address(env.get("NOTIFY_SOCKET", ""))
        self.watchdog_usec = _watchdog_usec(env)
        self._last_ping = 0.0
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_enabled(self) -> bool:
        return self.enabled and self.watchdog_usec > 0

    def notify(self, **fields: str | int) -> bool:
        """Send one datagram of KEY=VALUE lines; returns whether it was sent."""
        if self.address is None:
            return False
        lines = [f"{key.upper()}={value}" for key, value in fields.items()]
        assert all("\n" not in line for line in lines), lines
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.sendto("\n".join(lines).encode(), self.address)
        return True

    def ready(self, status: str = "") -> bool:
        if status:
            return self.notify(ready=1, status=status, mainpid=os.getpid())
        return self.notify(ready=1, mainpid=os.getpid())

    def status(self, text: str) -> bool:
        return self.notify(status=text.replace("\n", " "))

    def extend_timeout(self, seconds: float) -> bool:
        """Ask systemd for `seconds` more before the start (or stop) timeout fires."""
        return self.notify(extend_timeout_usec=int(seconds * 1_000_000))

    def stopping(self, status: str = "") -> bool:
        if status:
            return self.notify(stopping=1, status=status)
        return self.notify(stopping=1)

    def watchdog_ping(self, now: float | None = None) -> bool:
        """WATCHDOG=1 at most every half watchdog interval; returns whether one was sent."""
        if not self.watchdog_enabled:
            return False
        now = time.monotonic() if now is None else now
        if now - self._last_ping < self.watchdog_usec / 2e6:
            return False
        self._last_ping = now
        return self.notify(watchdog=1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _parse_address(value: str) -> str | bytes | None:
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    # vsock addresses ("vsock:CID:PORT") exist for VMs; a device service never gets one.
    return None


def _watchdog_usec(env) -> int:
    try:
        usec = int(env.get("WATCHDOG_USEC", "0"))
    except ValueError:
        return 0
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return 0
    return max(usec, 0)
