"""systemd socket activation (sd_listen_fds(3)) with the standard library only.

Invariants:
- Passed descriptors start at fd 3 (SD_LISTEN_FDS_START); $LISTEN_FDS counts them and they are
  ours only if $LISTEN_PID equals our pid (otherwise they were meant for a parent: ignored).
- The sockets returned are the *listening* sockets systemd keeps a duplicate of (Accept=no): we
  never shutdown() them, and closing ours leaves systemd's copy listening for the next start.
- After reading, the LISTEN_* variables are removed from os.environ so children don't claim fds.
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


def activated_unix_socket() -> socket.socket | None:
    """The one listening AF_UNIX stream socket systemd passed us, or None if not activated."""
    fds = listen_fds()
    if not fds:
        return None
    if len(fds) != 1:
        raise ConfigError(
            f"systemd passed {len(fds)} sockets ({[n for n, _ in fds]}); "
            "edge-runtime.socket must have exactly one ListenStream="
        )
    sock = socket.socket(fileno=fds[0][1])
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise ConfigError(
            "the socket passed by systemd is not a Unix stream socket; "
            "use ListenStream=/run/edge-runtime.sock and Accept=no"
        )
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise ConfigError("the socket passed by systemd is not listening; set Accept=no")
    return sock
