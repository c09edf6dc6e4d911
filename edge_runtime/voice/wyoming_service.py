"""Wiring of the Wyoming server over a loaded runtime (voice/session.py's `Runtime`): the voice
loop (system prompt prefilled once, the home's actions), the bounded ASR pool, the `info`, the
listener; `run_wyoming` serves until Ctrl-C or SIGTERM. Used by `edge-runtime voice --wyoming`,
`edge-runtime bench wyoming` and the tests, so all three run the same path."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Callable

from edge_runtime.voice.asr import ASRPool
from edge_runtime.voice.config import VoiceConfig
from edge_runtime.voice.loop import LoopSettings
from edge_runtime.voice.session import Runtime, build_loop
from edge_runtime.voice.wyoming_config import is_loopback
from edge_runtime.voice.wyoming_conversations import Conversations
from edge_runtime.voice.wyoming_info import server_info
from edge_runtime.voice.wyoming_server import WyomingServer
from edge_runtime.voice.wyoming_shared import WyomingShared


@contextlib.asynccontextmanager
async def wyoming_server(runtime: Runtime, config: VoiceConfig, host: str, port: int,
                         model_name: str, on_event: Callable[[dict], None] | None = None,
                         on_turn: Callable[[dict], None] | None = None):
    """-> (server, (host, port) bound); everything is stopped and closed on the way out."""
    settings = LoopSettings(vad=config.vad, max_tokens=config.max_tokens,
                            history_tokens=config.history_tokens)
    pool = ASRPool(runtime.recognizer, config.asr_workers) if runtime.recognizer else None
    loop = build_loop(runtime, config, settings, pool, on_event=on_event)
    asr_name = getattr(runtime.recognizer, "name", "none")
    info = server_info(asr_name, model_name, config.wyoming.tts_voice, loop.actions is not None)
    shared = WyomingShared(loop, pool, config.wyoming, config.vad, info,
                           Conversations(loop.conversation))
    if on_turn is not None:
        shared.on_turn = on_turn
    await loop.prewarm()
    server = WyomingServer(shared, host, port)
    try:
        address = await server.start()
        yield server, address
    finally:
        await server.stop()
        if pool is not None:
            await asyncio.to_thread(pool.close)


def exposure_warning(host: str, port: int) -> str | None:
    """What a non-loopback address exposes (Wyoming has no authentication), or None."""
    if is_loopback(host):
        return None
    return (f"warning: the Wyoming server on {host}:{port} has no authentication: anyone who can "
            "reach this port can have speech transcribed, text spoken and the home's actions run "
            "(docs/voice.md); keep it to a network you trust or firewall it to Home Assistant")


def run_wyoming(runtime: Runtime, config: VoiceConfig, host: str, port: int, model_name: str,
                progress: Callable[[str], None], on_event: Callable[[dict], None] | None = None
                ) -> dict:
    """Serve until Ctrl-C or SIGTERM; -> the server's connection counters."""

    async def serve() -> dict:
        stop = asyncio.Event()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        async with wyoming_server(runtime, config, host, port, model_name, on_event) as (
                server, address):
            progress(f"Wyoming server listening on tcp://{address[0]}:{address[1]} "
                     f"(at most {config.wyoming.max_connections} connections)")
            warning = exposure_warning(host, address[1])
            if warning:
                progress(warning)
            await stop.wait()
        return server.stats()  # after stop(): every connection closed

    try:
        return asyncio.run(serve())
    except KeyboardInterrupt:
        return {}
