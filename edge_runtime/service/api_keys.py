"""API keys of the TCP listener: the keys file, the Bearer check, and the middleware applying it.

Invariants:
- The keys file is a regular file owned by the service's user with no permission bits for its
  group or others (mode 0600 or 0400); anything else refuses to start with a message saying
  `chmod 600` (or `chown`). One key per line; blank lines and `#` comments are skipped; a key is
  at least MIN_KEY_CHARS printable ASCII characters without spaces. No message quotes a key.
- Only SHA-256 digests of the keys are kept. A presented token is hashed and compared with every
  key's digest by hmac.compare_digest, all of them, with no early exit: the time taken says
  neither which key nor how much of one matched, nor its length.
- With keys configured, every request that arrives over TCP (loopback included) needs
  `Authorization: Bearer KEY`; a missing, malformed, short or wrong key gets the same 401 with
  one fixed body, and the connection is closed. A URL with a query string is refused (400)
  before any key is looked at, so that a key pasted into a URL is never accepted; the service
  never logs a query string (access logging is off; app.ProtocolLog redacts it). Requests over
  the Unix socket (its file mode is its access control) are not asked for a key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import stat

from aiohttp import web

from edge_runtime.errors import ConfigError
from edge_runtime.service.api_error import ApiError
from edge_runtime.service.state import STATE_KEY

MIN_KEY_CHARS = 32
_BEARER = "bearer "
UNAUTHORIZED_MESSAGE = "missing or invalid API key"
QUERY_MESSAGE = ("this listener refuses URLs with a query string, so that an API key is never "
                 "sent in a URL; send the key as the header 'Authorization: Bearer KEY'")


class ApiKeys:
    """The digests of the configured keys; `accepts` checks an Authorization header value."""

    def __init__(self, keys: list[str]) -> None:
        assert keys, "ApiKeys needs at least one key"
        self._digests = [_digest(key) for key in keys]

    def __len__(self) -> int:
        return len(self._digests)

    def accepts(self, authorization: str | None) -> bool:
        token = ""
        if authorization and authorization[:len(_BEARER)].lower() == _BEARER:
            token = authorization[len(_BEARER):].strip()
        presented = _digest(token)
        matched = 0
        for digest in self._digests:  # every key, always: no early exit
            matched |= hmac.compare_digest(presented, digest)
        return bool(matched)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def load_api_keys(path: str, flag: str = "--api-keys") -> ApiKeys:
    """The keys of `path`, after checking who may read it; a ConfigError naming `flag` otherwise."""
    where = f"{flag} {path}"
    try:  # O_NONBLOCK: a FIFO at the path must not hang the start (refused below)
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot open it ({exc.strerror or exc})") from None
    try:
        _check_owner_and_mode(os.fstat(fd), path, where)
        data = _read_all(fd)
    finally:
        os.close(fd)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not ASCII text; put one key per line (printable ASCII, e.g. "
                          "from `openssl rand -hex 32`)") from None
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        if any(c.isspace() or not c.isprintable() for c in key):
            raise ConfigError(f"{where}: line {number}: a key may not hold spaces or control "
                              "characters (one key per line)")
        if len(key) < MIN_KEY_CHARS:
            raise ConfigError(f"{where}: line {number}: a key of {len(key)} characters is too "
                              f"short; use at least {MIN_KEY_CHARS} (e.g. `openssl rand -hex 32`)")
        keys.append(key)
    if not keys:
        raise ConfigError(f"{where}: holds no key; put one key per line (e.g. from "
                          "`openssl rand -hex 32`)")
    return ApiKeys(keys)


def _read_all(fd: int, limit: int = 1 << 20) -> bytes:
    chunks, size = [], 0
    while size < limit and (chunk := os.read(fd, limit - size)):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _check_owner_and_mode(info: os.stat_result, path: str, where: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{where}: not a regular file; give the file that holds the keys")
    if info.st_mode & 0o077:
        raise ConfigError(f"{where}: its group or other users may read or write it (mode "
                          f"{stat.S_IMODE(info.st_mode):04o}); run `chmod 600 {path}` so that "
                          "only the service's user can read it")
    if info.st_uid != os.geteuid():
        raise ConfigError(f"{where}: owned by uid {info.st_uid}, not by the user the service runs "
                          f"as (uid {os.geteuid()}); chown it to that user and chmod 600")


def unauthorized() -> ApiError:
    """The one answer to every key that is not accepted: no hint which part was wrong."""
    return ApiError(401, UNAUTHORIZED_MESSAGE, "invalid_api_key",
                    headers={"WWW-Authenticate": 'Bearer realm="edge-runtime"'},
                    close_connection=True)


@web.middleware
async def api_key_middleware(request: web.Request, handler):
    keys: ApiKeys | None = request.app[STATE_KEY].api_keys
    if keys is not None and _over_tcp(request):
        if request.query_string:
            raise ApiError(400, QUERY_MESSAGE, "query_string_refused", close_connection=True)
        if not keys.accepts(request.headers.get("Authorization")):
            raise unauthorized()
    return await handler(request)


def _over_tcp(request: web.Request) -> bool:
    """Whether the request came over TCP; a connection already gone counts as TCP (fail closed)."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    return sock is None or sock.family in (socket.AF_INET, socket.AF_INET6)
