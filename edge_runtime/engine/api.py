"""Request-level types shared by the engine, the CLI, the service, the voice loop and the benchmarks.

Only data here: the engine (edge_runtime/engine/engine.py) implements the behaviour. Validation of
user-supplied values happens in `SamplingParams.__post_init__` and raises `RequestError`, so every
front end (CLI, HTTP, voice) gets the same message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from edge_runtime.errors import RequestError

FINISH_REASONS = ("stop", "length", "cancelled", "error")
# torch.Generator takes a 64-bit seed, signed or unsigned (-1 and 2**64 - 1 are the same seed)
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1
# The sampler packs the batch's top_k values into an int64 tensor: a k of 2**63 or more would stop
# the engine loop (OverflowError). No vocabulary comes near 2**31, so any k above it means "all".
TOP_K_MAX = (1 << 31) - 1
# The sampler computes in float32 (engine/sampler.py). A temperature that float32 cannot hold as a
# normal number (1e-300 became 0, and the logits NaN) is greedy: the limit of sampling as the
# temperature goes to 0, which is what such a value asks for. One above float32's largest number
# would become inf, so it is refused. A repetition penalty below REPETITION_PENALTY_MIN could
# divide a logit past float32's range (+inf, then NaN probabilities).
FLOAT32_MAX = 3.4028234663852886e38
GREEDY_BELOW_TEMPERATURE = 1.1754943508222875e-38  # float32's smallest normal number
REPETITION_PENALTY_MIN = 1e-9


# OpenAI's top_logprobs limit
MAX_TOP_LOGPROBS = 20
GRAMMAR_KINDS = ("json_schema", "json_object", "structural_tag")


@dataclass(frozen=True)
class GrammarSpec:
    """A constraint on the generated text (engine/grammar.py compiles it; cached per spec)."""

    kind: str  # one of GRAMMAR_KINDS
    text: str = ""  # json_schema: the schema; structural_tag: the tag; as JSON text
    strict: bool = True  # json_schema: objects allow no properties beyond those listed
    what: str = field(default="the grammar", compare=False)  # how an error names it

    def __post_init__(self) -> None:
        assert self.kind in GRAMMAR_KINDS, self.kind


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 128
    temperature: float = 0.0  # 0 means greedy; so does anything below GREEDY_BELOW_TEMPERATURE
    top_k: int = 0  # 0 means off
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    # OpenAI's: minus presence_penalty for every token generated at least once, minus
    # frequency_penalty times its count (generated tokens only; after the repetition penalty)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    n: int = 1  # parallel samples, forked from the prompt's pages
    beam_width: int = 1  # beam search when > 1 (greedy, length-normalised like transformers)
    grammar: GrammarSpec | None = None  # constrained decoding: every completion matches it
    logprobs: int | None = None  # None: off; k >= 0: each token's log-prob and the k most likely

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not 0 <= self.temperature <= FLOAT32_MAX:  # NaN fails every comparison
            raise RequestError(f"temperature must be a number in [0, {FLOAT32_MAX:.7g}] (a finite "
                               f"float32), got {self.temperature}")
        if self.temperature < GREEDY_BELOW_TEMPERATURE:  # frozen: set once, here
            object.__setattr__(self, "temperature", 0.0)
        if not _is_int(self.top_k) or not 0 <= self.top_k <= TOP_K_MAX:
            raise RequestError(f"top_k must be an integer in [0, {TOP_K_MAX}] (0: off), "
                               f"got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if not REPETITION_PENALTY_MIN <= self.repetition_penalty < math.inf:
            raise RequestError(f"repetition_penalty must be a finite number >= "
                               f"{REPETITION_PENALTY_MIN:g}, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not -2 <= value <= 2:
                raise RequestError(f"{name} must be a number in [-2, 2], got {value!r}")
        if (self.presence_penalty or self.frequency_penalty) and self.beam_width > 1:
            raise RequestError("presence_penalty and frequency_penalty do not apply to beam search "
                               "(beam_width > 1)")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise RequestError(f"seed must be an integer in [-2**63, 2**64 - 1], got {self.seed}")
        if not _is_int(self.n) or not 1 <= self.n <= 16:
            raise RequestError(f"n must be an integer between 1 and 16, got {self.n!r}")
        if not _is_int(self.beam_width) or not 1 <= self.beam_width <= 4:
            raise RequestError(f"beam_width must be between 1 and 4, got {self.beam_width}")
        if self.beam_width > 1 and self.n > 1:
            raise RequestError("use either n > 1 (sampling) or beam_width > 1, not both")
        if self.grammar is not None and self.beam_width > 1:
            raise RequestError("beam search (beam_width > 1) cannot be combined with a grammar "
                               "(response_format or tools); use n > 1 or drop one")
        if self.logprobs is not None and (not _is_int(self.logprobs)
                                          or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise RequestError(f"logprobs (the number of top alternatives) must be an integer "
                               f"in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs!r}")
        if self.logprobs is not None and self.beam_width > 1:
            raise RequestError("logprobs are not reported for beam search (beam_width > 1)")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class RequestTimings:
    """Seconds, measured with time.perf_counter() from the moment the request was added."""

    queue_s: float = 0.0  # added -> first scheduled
    first_token_s: float = 0.0  # added -> first generated token
    total_s: float = 0.0  # added -> finished


@dataclass(frozen=True)
class TokenLogprob:
    """The model's log-probability of a generated token (before the grammar mask, temperature,
    top-k/top-p), and the `top` most likely tokens at that position, most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Completion:
    """One generated continuation (a request with n > 1 or beams has several)."""

    text: str
    token_ids: list[int]
    finish_reason: str  # one of FINISH_REASONS
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked


@dataclass
class GenerationResult:
    request_id: str
    prompt_tokens: int
    cached_prompt_tokens: int  # prompt tokens whose K/V came from the prefix cache
    completions: list[Completion]
    timings: RequestTimings = field(default_factory=RequestTimings)
    error: str | None = None  # why the request failed (its completions end with "error")

    @property
    def text(self) -> str:
        return self.completions[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.completions[0].token_ids

    @property
    def finish_reason(self) -> str:
        return self.completions[0].finish_reason

    @property
    def generated_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.completions)


@dataclass
class TokenEvent:
    """What a streaming consumer receives: new text for one completion, or the final result."""

    request_id: str
    index: int  # which completion (0 unless n > 1)
    token_ids: list[int]
    text: str  # detokenized delta (may be empty while a multi-byte character is incomplete)
    result: GenerationResult | None = None  # set on the last event of the request
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked
