"""The aiohttp application: routes and the plain (non-generating) endpoints; the service state
they share is service/state.py's `ServiceState`.

Invariants:
- /health is 200 only while the engine loop thread runs: once it has died (an exception escaped a
  step) it answers 503 "failed", new requests get 503 `engine_failed`, and the watchdog stops
  (server.py) so systemd restarts the service.
- The app exists before the model is loaded: /health answers 503 "loading" until `set_ready`,
  so clients that connect early (socket activation) get a clear answer, never a hang.
- With API keys configured, a request over TCP passes service/api_keys.py's check before any
  handler runs (401 otherwise); the Unix socket is not asked for a key.
- Every error answer is JSON `{"error": {"message", "type", "code", "param"}}` with a 4xx/5xx status,
  including unknown routes and wrong methods; a handler bug answers 500 JSON and is logged.
  The one exception: a request aiohttp's HTTP parser refuses before any handler runs (request
  line or header too long, bad Content-Length...) gets aiohttp's text/plain 400 and the connection
  is closed; aiohttp has no hook for that answer. It is logged as one INFO line (`ProtocolLog`).
- `in_flight` counts accepted generation requests (`state.book`, service/accounting.py), counted
  once the body is read and valid; more than `limits.max_in_flight` is answered 429 with
  Retry-After. /metrics and /v1/stats split it as running + queued + outside_engine, in requests,
  with the engine's side read on its loop thread between steps (`collect_stats`).
"""

from __future__ import annotations

import logging
import re

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from edge_runtime.service.api_keys import api_key_middleware
from edge_runtime.service.metrics import render_prometheus
from edge_runtime.service.schema import ApiError
from edge_runtime.service.state import STATE_KEY, ServiceState

log = logging.getLogger(__name__)


def json_error(exc: ApiError) -> web.Response:
    response = web.json_response(exc.body(), status=exc.status, headers=exc.headers)
    if exc.close_connection:
        response.force_close()
    return response


_QUERY = re.compile(r"\?[^\s'\"]*")


class ProtocolLog(logging.LoggerAdapter):
    """aiohttp's connection-level logger. A request its HTTP parser refuses is the client's error,
    answered 400 by aiohttp: one INFO line, not an ERROR with a traceback, and with any query
    string of the request line it quotes redacted (it may hold an API key). Anything else (an
    exception escaping the app, a bug) keeps its traceback."""

    def exception(self, msg, *args, exc_info=True, **kwargs) -> None:
        if isinstance(exc_info, HttpProcessingError):
            text = _QUERY.sub("?<query redacted>", " ".join(str(exc_info.message).split()))
            self.info("refused a malformed HTTP request (%s %s): %s", exc_info.code,
                      type(exc_info).__name__, text[:300])
        else:
            super().exception(msg, *args, exc_info=exc_info, **kwargs)


@web.middleware
async def error_middleware(request: web.Request, handler):
    state: ServiceState = request.app[STATE_KEY]
    endpoint = request.match_info.route.resource.canonical if request.match_info.route.resource \
        else "unknown"
    if state.connections is not None:  # handling a request: not the idle one to close
        state.connections.busy(request.protocol)
    try:
        response = await handler(request)
    except ApiError as exc:
        response = json_error(exc)
    except web.HTTPException as exc:  # 404 unknown route, 405 wrong method, 413 from aiohttp
        response = json_error(_http_error(request, exc))
    except Exception:
        log.exception("handler failed: %s %s", request.method, request.path)
        response = json_error(ApiError(500, "internal server error (see the service log)",
                                       "internal_error", type_="server_error"))
    finally:
        if state.connections is not None:
            state.connections.idle(request.protocol)
    state.metrics.record_request(endpoint, response.status)
    return response


def _http_error(request: web.Request, exc: web.HTTPException) -> ApiError:
    """aiohttp's routing errors as JSON that says what to do; 405 keeps its Allow header."""
    message, headers = exc.reason, {}
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = sorted(m for m in exc.allowed_methods if m != "HEAD")
        message = f"{request.method} is not allowed on {request.path}; use {' or '.join(allowed)}"
        headers = {"Allow": exc.headers["Allow"]}
    elif isinstance(exc, web.HTTPNotFound):
        message = f"no endpoint at {request.path}; the endpoints are {', '.join(_endpoints(request))}"
    return ApiError(exc.status, message, _code(exc.status), headers=headers)


def _endpoints(request: web.Request) -> list[str]:
    return [f"{r.method} {r.resource.canonical}" for r in request.app.router.routes()
            if r.method != "HEAD" and r.resource is not None]


def _code(status: int) -> str:
    return {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(status,
                                                                                  f"http_{status}")


async def health(request: web.Request) -> web.Response:
    status, body = request.app[STATE_KEY].health()
    return web.json_response(body, status=status)


async def models(request: web.Request) -> web.Response:
    state: ServiceState = request.app[STATE_KEY]
    return web.json_response({"object": "list", "data": [
        {"id": state.model_name, "object": "model", "created": state.created,
         "owned_by": "edge-runtime", "max_model_len": state.context_len or None}]})


async def stats(request: web.Request) -> web.Response:
    return web.json_response(await request.app[STATE_KEY].collect_stats())


async def metrics(request: web.Request) -> web.Response:
    text = render_prometheus(await request.app[STATE_KEY].collect_stats())
    return web.Response(text=text, content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Format": "prometheus-0.0.4"})


def build_app(state: ServiceState) -> web.Application:
    from edge_runtime.service.generate import chat_completions, completions  # loads the engine API

    # The body limit is enforced (with a JSON 413) by body.read_body; this is a backstop.
    # body.read_body decodes Content-Encoding itself, so that a body that does not decode
    # or an unsupported coding is a JSON 400/415 rather than a 500 or aiohttp's text/plain 400.
    app = web.Application(middlewares=[error_middleware, api_key_middleware],
                          client_max_size=state.limits.max_body_bytes + 1,
                          handler_args={"auto_decompress": False,
                                        "keepalive_timeout": state.limits.idle_timeout_s,
                                        "logger": ProtocolLog(logging.getLogger("aiohttp.server"))})
    app[STATE_KEY] = state
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    return app
