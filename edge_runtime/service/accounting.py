"""Where each accepted request is: the service's book of requests in flight, split by the engine.

A request enters the book once its body is read and valid, and leaves it when its handler ends,
whatever happened. In between it is in one phase, set by its handler on the event loop thread:
  preparing  tokenized and checked, not yet given to the engine
  in_engine  given to the engine (AsyncEngine.stream), its final event not yet received
  answering  the engine is done with it; the rest of its answer is being written
`InFlight` splits a snapshot of the book by what the engine holds at one moment between steps
(read on the engine's loop thread, AsyncEngine.call): running (a sequence of the request is in the
batch), queued (the engine holds it, none of its sequences runs: not admitted yet, or preempted),
outside_engine (the rest: preparing, answering, or in_engine but already finished there and its
final event still on its way).

Invariant: in_flight == running + queued + outside_engine, each counted in requests (the engine's
own `running` / `waiting` count sequences: a request with n = 4 holds four).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

PHASES = ("preparing", "in_engine", "answering")


@dataclass(frozen=True)
class InFlight:
    in_flight: int
    running: int
    queued: int
    outside_engine: int

    def __post_init__(self) -> None:
        assert self.in_flight == self.running + self.queued + self.outside_engine, self

    def as_dict(self) -> dict:
        return asdict(self)


class RequestBook:
    """The requests a service holds, by id; only the event loop thread changes it."""

    def __init__(self) -> None:
        self._phase: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._phase)

    def enter(self, rid: str) -> None:
        assert rid not in self._phase, rid
        self._phase[rid] = "preparing"

    def move(self, rid: str, phase: str) -> None:
        assert phase in PHASES and rid in self._phase, (rid, phase)
        self._phase[rid] = phase

    def leave(self, rid: str) -> None:
        del self._phase[rid]

    def snapshot(self) -> dict[str, str]:
        return dict(self._phase)


def split(book: dict[str, str], engine_running: set[str], engine_held: set[str]) -> InFlight:
    """Requests of `book` (a RequestBook snapshot) by where the engine has them: `engine_running`
    are the ids with a sequence in the batch, `engine_held` every id the engine has unfinished."""
    in_engine = [rid for rid, phase in book.items() if phase == "in_engine"]
    running = sum(rid in engine_running for rid in in_engine)
    queued = sum(rid in engine_held and rid not in engine_running for rid in in_engine)
    return InFlight(len(book), running, queued, len(book) - running - queued)


def engine_requests(engine) -> tuple[set[str], set[str]]:
    """(ids with a sequence in the batch, ids the engine holds unfinished); call it on the engine's
    loop thread between steps (AsyncEngine.call), where the two are read at one moment."""
    snapshot = engine.snapshot()
    return set(snapshot.running_request_ids), set(snapshot.held_request_ids)
