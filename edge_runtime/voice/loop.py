"""The voice loop: N streams, each source -> VAD (front-end thread) -> ASR pool -> engine -> answer.

Concurrency (asyncio, one event loop):
- per stream, a front-end thread (voice/frontend.py) cuts utterances and posts them;
- per stream, `_recognize` hands each utterance to the shared, bounded ASR pool as soon as it is
  cut (so recognition runs ahead while the previous answer is still generating), and `_answer`
  consumes recognitions in order: one turn at a time per stream, because turn t's prompt contains
  turn t-1's answer; different streams' turns are in flight together, and the engine batches them;
- a fault is confined to its stream: it becomes an `error` event naming the file and the problem.

Every utterance yields one JSON-able event (`kind: "utterance"`); times are seconds measured with
perf_counter from `end_wall`, the moment the last speech frame reached the VAD (for text commands:
the moment the line was read). The latency split:
  vad_s   end of speech -> utterance cut (the min-silence wait, in --realtime mode)
  asr_queue_s, asr_s     waiting for an ASR worker; recognition
  turn_wait_s            waiting for this stream's previous answer to finish
  grammar_s              the actions' grammar narrowed to the command, compiled (cached per set)
  engine_queue_s         engine: added -> first scheduled
  prefill_s              engine: first scheduled -> first token (the uncached prompt tokens)
  first_token_s          end of speech -> first answer token (the headline latency)
  answer_s               first token -> last token
  total_s                end of speech -> answer complete (and spoken, with --tts/--tts-play)
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from edge_runtime.engine.api import SamplingParams
from edge_runtime.errors import EdgeError
from edge_runtime.service.tool_format import ToolFunction, call_grammar, parse_calls
from edge_runtime.voice.actions import Dispatcher
from edge_runtime.voice.asr import ASRPool, ASRResult
from edge_runtime.voice.call_narrowing import narrow_functions
from edge_runtime.voice.audio_input import Source
from edge_runtime.voice.frontend import Command, Fault, FrontEnd
from edge_runtime.voice.prompting import Conversation, encode_text
from edge_runtime.voice.tts import speak_to_device, speak_to_wav
from edge_runtime.voice.vad import UtteranceCutter, VADConfig, make_detector


ACTION_MIN_TOKENS = 96  # a call with its arguments is ~40 tokens; a cut call does nothing


def action_params(functions: list[ToolFunction], max_tokens: int) -> SamplingParams:
    """Greedy, exactly one call of one of the functions (service/tool_format.py's grammar)."""
    grammar = call_grammar(functions, "required", parallel=False, what="the actions")
    return SamplingParams(max_tokens=max(max_tokens, ACTION_MIN_TOKENS), temperature=0.0,
                          grammar=grammar)


@dataclass(frozen=True)
class LoopSettings:
    vad: VADConfig = field(default_factory=VADConfig)
    max_tokens: int = 48
    history_tokens: int = 600
    realtime: bool = False  # pace audio at 1x (latency as a user would see it)
    stagger_s: float = 0.0  # stream i starts i * stagger_s later (realtime only)
    tts_dir: Path | None = None  # speak answers into WAVs here
    tts_voice: str = "en-us"
    half_duplex: bool = False  # a stream's next command is read after its previous answer
    tts_play: bool = False  # speak answers on the default audio device


@dataclass
class StreamReport:
    stream: int
    source: str
    events: list[dict] = field(default_factory=list)  # utterance events, in order
    faults: list[dict] = field(default_factory=list)


class VoiceLoop:
    def __init__(self, aengine, tokenizer, asr_pool: ASRPool | None, system_prompt: str,
                 settings: LoopSettings, eos_token_ids: tuple[int, ...] = (),
                 on_event: Callable[[dict], None] | None = None,
                 on_text: Callable[[int, str], None] | None = None,
                 actions: Dispatcher | None = None):
        self.aengine = aengine
        self.tokenizer = tokenizer
        self.asr_pool = asr_pool
        self.system_prompt = system_prompt
        self.settings = settings
        self.eos_token_ids = eos_token_ids
        self.on_event = on_event or (lambda ev: None)
        self.on_text = on_text  # streamed answer text: (stream, delta)
        self.actions = actions  # None: answers are free text
        self.params = SamplingParams(max_tokens=settings.max_tokens, temperature=0.0) \
            if actions is None else action_params(actions.functions, settings.max_tokens)
        self._device_lock = asyncio.Lock()  # one audio device: answers play one after another
        self.reports: list[StreamReport] = []  # filled as the streams go (kept if interrupted)

    async def run(self, sources: list[Source]) -> list[StreamReport]:
        self.reports = [StreamReport(i, s.name) for i, s in enumerate(sources)]
        await self.prewarm()
        await asyncio.gather(*(self._stream(i, s, self.reports[i])
                               for i, s in enumerate(sources)))
        return self.reports

    async def prewarm(self) -> None:
        """Prefill the shared system prompt once before any stream starts. The appliance knows it
        at start-up, so no stream's first command waits for another stream's prefill of it (or
        computes its own copy); every first turn then starts from the cached system prompt. The
        actions' grammar is compiled here too, off the engine's loop thread."""
        engine = getattr(self.aengine, "engine", None)  # None with --server (the service compiles)
        if self.params.grammar is not None and engine is not None:  # the actions' grammar: once,
            await asyncio.to_thread(engine.constraints.compiler.compile, self.params.grammar)
        text = self.tokenizer.apply_chat_template([{"role": "system", "content": self.system_prompt}],
                                                  tokenize=False, add_generation_prompt=False)
        try:
            async for _ in self.aengine.stream(encode_text(self.tokenizer, text),
                                               SamplingParams(max_tokens=1, temperature=0.0)):
                pass
        except EdgeError as exc:  # e.g. the service is unreachable: each turn reports it as a fault
            logging.getLogger(__name__).warning("system prompt not prefilled: %s", exc)

    def _emit(self, report: StreamReport, event: dict) -> None:
        (report.faults if event["kind"] == "error" else report.events).append(event)
        self.on_event(event)

    async def _stream(self, index: int, source: Source, report: StreamReport) -> None:
        loop = asyncio.get_running_loop()
        commands: asyncio.Queue = asyncio.Queue()
        recognized: asyncio.Queue = asyncio.Queue()
        cutter = (None if source.spec.kind == "text"  # no VAD (no silero session) for text
                  else UtteranceCutter(self.settings.vad, make_detector(self.settings.vad)))
        front = FrontEnd(source, cutter, commands, loop, self.settings.realtime,
                         index * self.settings.stagger_s, self.settings.half_duplex)
        conv = self.conversation()
        front.start()
        try:
            await asyncio.gather(self._recognize(index, commands, recognized, report),
                                 self._answer(index, recognized, conv, report, front.answered))
        finally:
            front.stop()

    def conversation(self) -> Conversation:
        """A new stream's history. With actions every command stands alone: with earlier calls
        in the prompt the small model repeats the previous call (docs/voice.md, "Actions"); the
        system prompt is still shared."""
        history = self.settings.history_tokens if self.actions is None else 0
        return Conversation(self.tokenizer, self.system_prompt, history, self.eos_token_ids)

    async def answer(self, index: int, turn: int, command: Command, asr: ASRResult,
                     conv: Conversation, report: StreamReport) -> dict:
        """One recognized command of stream `index` (a caller outside `run`, e.g. the Wyoming
        server): answered with `conv`'s history, acted on, reported; -> its utterance event
        (`answer` holds what to say; `skipped` when nothing was heard or the engine refused)."""
        return await self._one_command(index, turn, (command, asr), conv, report)

    async def _recognize(self, index: int, commands: asyncio.Queue, out: asyncio.Queue,
                         report: StreamReport) -> None:
        while True:
            item = await commands.get()
            if item is None:
                await out.put(None)
                return
            if isinstance(item, Fault):
                self._emit(report, {"kind": "error", "stream": index, "source": item.source,
                                    "problem": item.problem, "fatal": item.fatal})
                continue
            if item.text is not None:
                await out.put((item, ASRResult(item.text, 0.0, 0.0, item.ready_wall)))
                continue
            assert self.asr_pool is not None, "audio commands need an ASR pool"
            task = asyncio.ensure_future(self.asr_pool.transcribe(item.utterance.audio))
            await out.put((item, task))

    async def _answer(self, index: int, recognized: asyncio.Queue, conv: Conversation,
                      report: StreamReport, answered: Callable[[], None]) -> None:
        turn = 0
        while True:
            item = await recognized.get()
            if item is None:
                return
            try:
                await self._one_command(index, turn, item, conv, report)
            finally:
                answered()
            turn += 1

    async def _one_command(self, index: int, turn: int, item, conv: Conversation,
                           report: StreamReport) -> dict | None:
        command, asr = item
        if not isinstance(asr, ASRResult):
            try:
                asr = await asr
            except Exception as exc:  # a recognizer failure: this utterance, this stream only
                self._emit(report, {"kind": "error", "stream": index, "utterance": turn,
                                    "source": str(command.source), "fatal": False,
                                    "problem": f"{command.source}: speech recognition failed "
                                               f"({exc!r})"})
                return None
        event = self._base_event(index, turn, command, asr)
        if asr.text:
            try:
                await self._turn(index, turn, conv, command, asr, event)
            except EdgeError as exc:  # a prompt the engine refuses, a service down: this turn only
                event["skipped"] = f"not answered: {exc}"
                self._emit(report, {"kind": "error", "stream": index, "utterance": turn,
                                    "source": str(command.source), "fatal": False,
                                    "problem": f"{command.source}: command {turn} not answered: "
                                               f"{exc}"})
        else:
            event["skipped"] = "no speech recognised"
        self._emit(report, event)
        return event

    def _base_event(self, index: int, turn: int, command: Command, asr: ASRResult) -> dict:
        utt = command.utterance
        event = {"kind": "utterance", "stream": index, "utterance": turn,
                 "source": str(command.source), "transcript": asr.text,
                 "asr_queue_s": asr.queue_s, "asr_s": asr.asr_s}
        if utt is not None:
            event.update(speech_start_s=utt.start_s, speech_end_s=utt.end_s,
                         vad_s=utt.cut_wall - utt.end_wall)
        else:
            event.update(line=command.line, vad_s=0.0)
        return event

    async def _turn(self, index: int, turn: int, conv: Conversation, command: Command,
                    asr: ASRResult, event: dict) -> None:
        plan = conv.build(asr.text)
        added = time.perf_counter()
        first = None
        result = None
        request_id = f"voice-s{index}-u{turn}-{id(conv):x}"
        params = await self._params_for(asr.text)
        grammar_done = time.perf_counter()
        async for ev in self.aengine.stream(plan.prompt_ids, params, request_id=request_id):
            if first is None and (ev.token_ids or ev.text):
                first = time.perf_counter()
            if ev.text and self.on_text:
                self.on_text(index, ev.text)
            if ev.result is not None:
                result = ev.result
        done = time.perf_counter()
        assert result is not None, f"engine stream for {request_id} ended without a result"
        first = first or done
        conv.record(plan, asr.text, result.text, result.token_ids)
        t0 = command.ready_wall
        event.update(
            answer=result.text.strip(), finish_reason=result.finish_reason,
            prompt_tokens=result.prompt_tokens, cached_prompt_tokens=result.cached_prompt_tokens,
            reused_prompt_tokens=plan.reused_tokens, history_turns=plan.history_turns,
            dropped_turns=plan.dropped_turns, answer_tokens=len(result.token_ids),
            turn_wait_s=max(0.0, added - asr.done_wall), grammar_s=grammar_done - added,
            engine_queue_s=result.timings.queue_s,
            prefill_s=max(0.0, result.timings.first_token_s - result.timings.queue_s),
            first_token_s=first - t0, answer_s=done - first, total_s=done - t0,
        )
        spoken = result.text.strip()
        if self.actions is not None:
            spoken = await self._act(result, event)
        if spoken:
            await self._speak(index, turn, spoken, event)
            event["total_s"] = time.perf_counter() - t0

    async def _params_for(self, heard: str) -> SamplingParams:
        """Free text, or a call whose grammar is narrowed to what the command names
        (voice/call_narrowing.py); a new grammar is compiled off the engine's loop thread."""
        if self.actions is None:
            return self.params
        params = action_params(narrow_functions(self.actions.functions, heard),
                               self.settings.max_tokens)
        engine = getattr(self.aengine, "engine", None)  # None with --server (the service compiles)
        if engine is not None:  # cached per grammar: a repeated command compiles nothing
            await asyncio.to_thread(engine.constraints.compiler.compile, params.grammar)
        return params

    async def _act(self, result, event: dict) -> str:
        """Dispatch the answer's call; the event records it and the spoken answer reports it."""
        event["call_text"] = result.text
        _, calls = parse_calls(result.text)
        if not calls:  # only when max_tokens cut the call short
            event["action"] = {"ok": False, "error": f"no complete call ({result.finish_reason})"}
            event["answer"] = "Sorry, I did not get that. Please say it again."
            return event["answer"]
        outcome = await self.actions.dispatch(calls[0])
        event["action"] = outcome.to_event()
        event["answer"] = outcome.spoken
        return outcome.spoken

    async def _speak(self, index: int, turn: int, text: str, event: dict) -> None:
        """--tts: a WAV per answer; --tts-play: the audio device, one answer at a time."""
        try:
            if self.settings.tts_dir is not None:
                wav = self.settings.tts_dir / f"stream{index}_utt{turn}.wav"
                await speak_to_wav(text, wav, self.settings.tts_voice)
                event["tts_wav"] = str(wav)
            if self.settings.tts_play:
                async with self._device_lock:
                    await speak_to_device(text, self.settings.tts_voice)
        except EdgeError as exc:  # the answer stands; only speaking it failed
            event["tts_error"] = str(exc)
