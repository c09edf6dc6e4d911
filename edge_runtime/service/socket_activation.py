"""systemd socket activation (sd_listen_fds(3)) with the standard library only.

Invariants:
- Passed descriptors start at fd 3 (SD_LISTEN_FDS_START); $LISTEN_FDS counts them and they are
  ours only if $LISTEN_PID equals our pid (otherwise they were meant for a parent: ignored).
- The sockets returned are the *listening* sockets systemd keeps a duplicate of (Accept=no): we
  never shutdown() them, and closing ours leaves systemd's copy listening for the next start.
- After reading, the LISTEN_* variables are removed from os.environ so children don't claim fds.
- At most one Unix stream socket (the local API) and one TCP stream socket (the optional TCP
  listener, listen_address.py) are accepted; anything else is a ConfigError naming the fix.
"""

from __future__ import annotations

import os
import socket

from edge_runtime.errors import ConfigError

SD_LISTEN_FDS_START = 3


def listen_fds(unset_environment: bool = True) -> list[tuple[str, int]]:
    """Return [(name, fd)] handed over by systemd, or [] when not socket-activated."""
    env = os.environ
    try:
        count = int(env.get("LISTEN_FDS", "0"))
        pid = int(env.get("LISTEN_PID", "0"))
    except ValueError:
        return []
    if count <= 0 or pid != os.getpid():
        return []
    names = env.get("LISTEN_FDNAMES", "").split(":") if env.get("LISTEN_FDNAMES") else []
    names += ["unknown"] * (count - len(names))
    if unset_environment:
        for key in ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
            env.pop(key, None)
    fds = []
    for i in range(count):
        fd = SD_LISTEN_FDS_START + i
        os.set_inheritable(fd, False)
        fds.append((names[i], fd))
    return fds


def activated_sockets() -> tuple[socket.socket, socket.socket | None] | None:
    """(Unix stream socket, TCP stream socket or None) that systemd passed us; None when not
    activated. Exactly one Unix and at most one TCP socket, each listening (Accept=no)."""
    fds = listen_fds()
    if not fds:
        return None
    socks = [socket.socket(fileno=fd) for _, fd in fds]
    unix = [s for s in socks if s.family == socket.AF_UNIX]
    tcp = [s for s in socks if s.family in (socket.AF_INET, socket.AF_INET6)]
    if len(unix) != 1 or len(tcp) > 1 or len(unix) + len(tcp) != len(socks):
        raise ConfigError(
            f"systemd passed {len(fds)} sockets ({[n for n, _ in fds]}): {len(unix)} Unix, "
            f"{len(tcp)} TCP, {len(socks) - len(unix) - len(tcp)} of another family; "
            "edge-runtime.socket must have one ListenStream= with a path and at most one with "
            "HOST:PORT")
    for sock in socks:
        if sock.type != socket.SOCK_STREAM:
            raise ConfigError(
                "a socket passed by systemd is not a stream socket; use ListenStream= (not "
                "ListenDatagram=) and Accept=no")
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise ConfigError("a socket passed by systemd is not listening; set Accept=no")
    return unix[0], (tcp[0] if tcp else None)
