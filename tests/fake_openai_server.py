"""A stand-in for llama-server in tests: the same command line (-m, --host, --port, -np, -c), /health,
/v1/models and a streaming /v1/chat/completions that answers every request with the same three
content chunks and a usage chunk. `--fail-start` exits at once (a server that cannot start)."""

import argparse
import json
import sys

from aiohttp import web

PIECES = ["Turning", " on", " the lights."]


async def health(request):
    return web.json_response({"status": "ok"})


async def models(request):
    return web.json_response({"data": [{"id": "fake-model"}]})


async def chat(request):
    body = await request.json()
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for piece in PIECES[: body.get("max_tokens", 3)]:
        chunk = {"choices": [{"delta": {"content": piece}, "finish_reason": None}]}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
    usage = {"prompt_tokens": 10, "completion_tokens": len(PIECES)}
    await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("-np", type=int)
    ap.add_argument("-c", type=int)
    ap.add_argument("--fail-start", action="store_true")
    args = ap.parse_args()
    if args.fail_start:
        print("fake server: cannot load the model", flush=True)
        sys.exit(3)
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
