"""Histories of conversations that span connections.

Home Assistant's Wyoming conversation agent opens a new connection for every sentence and names
the conversation in the `transcript`'s context (`conversation_id`; it keeps the id while a
satellite's conversation goes on). So a typed command with a conversation id is answered with that
conversation's history, kept here across connections; one without is answered with its
connection's. At most `limit` conversations are kept, the least recently used dropped first, so
ids that are never seen again cost bounded memory.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

from edge_runtime.voice.prompting import Conversation

MAX_ID_CHARS = 128  # Home Assistant's ids are 26-character ULIDs


class Conversations:
    def __init__(self, make: Callable[[], Conversation], limit: int = 64):
        assert limit >= 1, limit
        self.make = make
        self.limit = limit
        self._by_id: OrderedDict[str, Conversation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, context: object) -> Conversation | None:
        """The history named by a context's `conversation_id`, or None when it names none."""
        key = context.get("conversation_id") if isinstance(context, dict) else None
        if not isinstance(key, str) or not key or len(key) > MAX_ID_CHARS:
            return None
        conv = self._by_id.pop(key, None) or self.make()
        self._by_id[key] = conv
        while len(self._by_id) > self.limit:
            self._by_id.popitem(last=False)
        return conv
