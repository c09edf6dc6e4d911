"""Stop conditions and incremental detokenization for one completion.

`StopChecker.append(token_id)` is called once per generated token and returns the text delta that
is safe to stream, plus the finish reason when the completion ends.

Invariants:
- The concatenation of all streamed deltas equals `text` (the final text), and never contains a
  stop string: text that could still grow into a stop string is held back until it cannot.
- A delta never ends inside a multi-byte character (a trailing U+FFFD from a partial UTF-8
  sequence is held back, the prefix/read offset scheme used by vLLM and TGI).
- Token ids: the token that completes a stop string or is a stop/eos id is kept in `token_ids`
  (it was generated); its text is not part of `text` for stop ids and eos.
"""

from __future__ import annotations

from edge_runtime.engine.api import SamplingParams


class StopChecker:
    def __init__(self, tokenizer, params: SamplingParams, eos_token_ids: tuple[int, ...]):
        self.tokenizer = tokenizer
        self.params = params
        self.stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            self.stop_ids |= set(eos_token_ids)
        self.stop_strings = tuple(s for s in params.stop if s)
        self.hold = max((len(s) for s in self.stop_strings), default=1) - 1
        self.token_ids: list[int] = []
        self.text_ids: list[int] = []  # ids whose text counts (stop ids and eos excluded)
        self.full_text = ""  # decoded text of text_ids (complete characters only)
        self.emitted = 0  # characters of full_text already streamed
        self.prefix_offset = 0
        self.read_offset = 0
        self.finish_reason: str | None = None
        self.text = ""

    def append(self, token_id: int) -> tuple[str, str | None]:
        """Record one generated token; return (text delta to stream, finish reason or None)."""
        assert self.finish_reason is None, "append after finish"
        self.token_ids.append(token_id)
        if token_id in self.stop_ids:
            return self._finish("stop", len(self.full_text))
        self.text_ids.append(token_id)
        self.full_text += self._decode_delta()
        if self.stop_strings:
            cut = self._find_stop()
            if cut is not None:
                return self._finish("stop", cut)
        if len(self.token_ids) >= self.params.max_tokens:
            return self._finish("length", len(self.full_text), flush=True)
        safe = len(self.full_text) - (self.hold if self.stop_strings else 0)
        return self._emit(safe), None

    def finish_cancelled(self) -> str:
        """End without a natural stop; returns the final delta."""
        delta, _ = self._finish("cancelled", len(self.full_text), flush=True)
        return delta

    def _finish(self, reason: str, end: int, flush: bool = False) -> tuple[str, str]:
        if flush or reason == "stop":
            self.full_text += self._decode_rest()
        end = min(end, len(self.full_text)) if reason == "stop" else len(self.full_text)
        self.finish_reason = reason
        self.text = self.full_text[:end]
        return self._emit(end), reason

    def _emit(self, upto: int) -> str:
        if upto <= self.emitted:
            return ""
        delta = self.full_text[self.emitted : upto]
        self.emitted = upto
        return delta

    def _find_stop(self) -> int | None:
        # Only the tail can contain a new match: the previous text was already searched.
        start = max(0, len(self.full_text) - len(self._last_delta) - self.hold)
        best = None
        for s in self.stop_strings:
            pos = self.full_text.find(s, start)
            if pos != -1 and (best is None or pos < best):
                best = pos
        return best

    def _decode_delta(self) -> str:
        """Text added by the newest id, holding back an incomplete multi-byte character."""
        ids = self.text_ids
        prefix = self._decode(ids[self.prefix_offset : self.read_offset])
        new = self._decode(ids[self.prefix_offset :])
        if len(new) > len(prefix) and not new.endswith("\ufffd"):
            delta = new[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(ids)
        else:
            delta = ""
        self._last_delta = delta
        return delta

    def _decode(self, ids: list[int]) -> str:
        # Special tokens (<|im_start|>, a second <|im_end|> under ignore_eos) are not answer text:
        # OpenAI servers (vLLM, llama-server) leave them out, and so does `generate`'s output.
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _decode_rest(self) -> str:
        """Whatever the held-back ids decode to (possibly with a replacement character)."""
        ids = self.text_ids
        if self.read_offset >= len(ids):
            return ""
        prefix = self._decode(ids[self.prefix_offset : self.read_offset])
        new = self._decode(ids[self.prefix_offset :])
        self.read_offset = len(ids)
        return new[len(prefix) :]

    _last_delta = ""
