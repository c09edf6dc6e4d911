"""One streamed choice: engine token events -> SSE chunks (content deltas, `tool_calls` deltas,
log-probs), and the final chunk with its finish_reason.

Invariants:
- With tools offered, text that may open a <tool_call> block is held back until it is known; a
  finished block is sent as one `tool_calls` delta (index, id, type, name, all of its arguments),
  which is how the openai client's stream accumulator reads it. Content and calls concatenate to
  what the non-streamed answer holds.
- Log-probs are sent with the chunk that carries their tokens' text, or with the next one when
  the text is held back; the final chunk carries whatever is left.
"""

from __future__ import annotations

from edge_runtime.service.tool_format import CallStreamParser
from edge_runtime.service import responses as R


class ChoiceStream:
    def __init__(self, kind: str, rid: str, model: str, created: int, index: int,
                 parse_calls: bool, tokenizer):
        self._head = (kind, rid, model, created, index)
        self._parser = CallStreamParser() if parse_calls else None
        self._tokenizer = tokenizer
        self._pending_logprobs: list = []
        self._logprobs_asked = False
        self.num_calls = 0

    def on_event(self, ev) -> list[dict]:
        if ev.logprobs is not None:
            self._logprobs_asked = True
            self._pending_logprobs += ev.logprobs
        if not ev.text:
            return []
        items = self._parser.feed(ev.text) if self._parser else [("content", ev.text)]
        return [self._chunk(kind, value) for kind, value in items]

    def finish(self, finish_reason: str) -> list[dict]:
        chunks = [self._chunk(kind, value) for kind, value in
                  (self._parser.finish() if self._parser else [])]
        if self.num_calls and finish_reason == "stop":
            finish_reason = "tool_calls"
        kind, rid, model, created, index = self._head
        empty = None if kind == "chat" else ""
        chunks.append(R.chunk(kind, rid, model, created, index, empty, finish_reason,
                              logprobs=self._take_logprobs()))
        return chunks

    def _chunk(self, item: str, value) -> dict:
        kind, rid, model, created, index = self._head
        if item == "call":
            call = R.tool_call(self.num_calls, value, with_index=True)
            self.num_calls += 1
            return R.chunk(kind, rid, model, created, index, tool_calls=[call],
                           logprobs=self._take_logprobs())
        return R.chunk(kind, rid, model, created, index, value, logprobs=self._take_logprobs())

    def _take_logprobs(self) -> list | None:
        if not self._logprobs_asked:
            return None
        lps, self._pending_logprobs = self._pending_logprobs, []
        return R.logprobs_content(self._tokenizer, lps)
