"""Word error rate (with text normalisation), percentiles and the per-stream tables of the voice
loop. Pure functions over the loop's events: no audio, no model.

Normalisation (applied to reference and hypothesis alike): lower case, numbers written as words
("21" -> "twenty one", 0..999999), "%" -> "percent", hyphens and punctuation -> spaces,
apostrophes removed ("what's" -> "whats"). WER = word-level Levenshtein distance / reference words.
With the voice loop's references, utterances are first aligned with the commands (`align`): a
command not heard counts all its words as errors, an extra utterance all of its words.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> str:
    assert 0 <= n < 1_000_000, n
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + number_words(rest))
    rest = n % 1000
    return number_words(n // 1000) + " thousand" + ("" if rest == 0 else " " + number_words(rest))


def normalize(text: str) -> list[str]:
    text = text.lower().replace("%", " percent ").replace("°", " degrees ")
    text = re.sub(r"['’]", "", text)
    text = re.sub(r"(\d),(\d{3})", r"\1\2", text)  # 1,000 -> 1000
    text = re.sub(r"\d+", lambda m: " " + (number_words(int(m.group()))
                                            if len(m.group()) <= 6 else m.group()) + " ", text)
    text = re.sub(r"[^a-z0-9 ]+", " ", text)
    return text.split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, start=1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, start=1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edits, reference words) after normalisation."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    return edit_distance(ref, hyp), len(ref)


def align(references: list[str], transcripts: list[str]) -> list[tuple[int | None, int | None]]:
    """Pairs each reference command with the utterance heard for it, in order: (i, j) matched,
    (i, None) a command no utterance was heard for (a deletion: its words are errors), (None, j)
    an utterance for no command (an insertion: its words are errors). The pairing minimises the
    stream's word edits, so a dropped or split utterance never shifts the later pairs."""
    ref = [normalize(r) for r in references]
    hyp = [normalize(h) for h in transcripts]
    n, m = len(ref), len(hyp)
    cost = [[0] * (m + 1) for _ in range(n + 1)]  # cost[i][j]: ref[:i] against hyp[:j]
    for i in range(1, n + 1):
        cost[i][0] = cost[i - 1][0] + len(ref[i - 1])
    for j in range(1, m + 1):
        cost[0][j] = cost[0][j - 1] + len(hyp[j - 1])
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            cost[i][j] = min(cost[i - 1][j - 1] + edit_distance(ref[i - 1], hyp[j - 1]),
                             cost[i - 1][j] + len(ref[i - 1]), cost[i][j - 1] + len(hyp[j - 1]))
    pairs: list[tuple[int | None, int | None]] = []
    i, j = n, m
    while i or j:  # back from the end; a match wins ties, so rows pair up where they can
        if i and j and cost[i][j] == cost[i - 1][j - 1] + edit_distance(ref[i - 1], hyp[j - 1]):
            i, j = i - 1, j - 1
            pairs.append((i, j))
        elif i and cost[i][j] == cost[i - 1][j] + len(ref[i - 1]):
            i -= 1
            pairs.append((i, None))
        else:
            j -= 1
            pairs.append((None, j))
    return pairs[::-1]


@dataclass(frozen=True)
class Score:
    """Word errors of utterances against reference commands, aligned with `align`."""

    edits: int
    words: int  # words of every reference command: the WER's denominator
    commands: int
    missed: tuple[str, ...] = ()  # commands no utterance was heard for
    extra: tuple[str, ...] = ()  # transcripts of utterances heard for no command

    @property
    def wer(self) -> float:
        return self.edits / self.words if self.words else math.nan

    @staticmethod
    def total(scores: list[Score]) -> Score:
        return Score(sum(s.edits for s in scores), sum(s.words for s in scores),
                     sum(s.commands for s in scores), tuple(m for s in scores for m in s.missed),
                     tuple(x for s in scores for x in s.extra))

    def gaps(self) -> str:
        """' (1 not heard: 'play the radio')', or '' when every command was paired."""
        parts = []
        if self.missed:
            parts.append(f"{len(self.missed)} not heard: " + ", ".join(map(repr, self.missed)))
        if self.extra:
            parts.append(f"{len(self.extra)} extra utterance(s): "
                         + ", ".join(map(repr, self.extra)))
        return f" ({'; '.join(parts)})" if parts else ""


def score(references: list[str], transcripts: list[str]) -> Score:
    """One stream's Score: every reference counts, heard or not; extra utterances count too."""
    edits = words = 0
    missed, extra = [], []
    for i, j in align(references, transcripts):
        ref = normalize(references[i]) if i is not None else []
        hyp = normalize(transcripts[j]) if j is not None else []
        edits, words = edits + edit_distance(ref, hyp), words + len(ref)
        if j is None:
            missed.append(references[i])
        elif i is None:
            extra.append(transcripts[j])
    return Score(edits, words, len(references), tuple(missed), tuple(extra))


def wer(pairs: list[tuple[str, str]]) -> float:
    """Corpus WER over (reference, hypothesis) pairs."""
    edits = words = 0
    for ref, hyp in pairs:
        e, w = word_errors(ref, hyp)
        edits, words = edits + e, words + w
    assert words > 0, "WER needs at least one reference word"
    return edits / words


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def stream_table(stream: int, events: list[dict], references: list[str] | None = None) -> str:
    """One stream's turns: command, transcript, answer, latency and cache use. With references,
    rows pair each command with the utterance heard for it (`align`): a command not heard is a
    row with no utterance, an utterance for no command a row with no command."""
    lines = [f"stream {stream}"]
    head = f"  {'#':>2} {'command':<34} {'transcript':<34} {'answer':<44} {'1st tok':>7} {'cached':>9}"
    lines.append(head)
    if references is None:
        rows = [(None, ev) for ev in events]
    else:
        rows = [(references[i] if i is not None else None, events[j] if j is not None else None)
                for i, j in align(references, [ev["transcript"] for ev in events])]
    for ref, ev in rows:
        lines.append(_row(ref, ev))
    firsts = [ev["first_token_s"] for ev in events if "first_token_s" in ev]
    later = [ev for ev in events if ev["utterance"] > 0 and "prompt_tokens" in ev]
    prompt = sum(e["prompt_tokens"] for e in later)
    share = sum(e["cached_prompt_tokens"] for e in later) / prompt if prompt else math.nan
    lines.append(f"  end of speech -> first token: p50 {_num(percentile(firsts, 50), '.2f', 's')}  "
                 f"p95 {_num(percentile(firsts, 95), '.2f', 's')};  cached prompt share, turns "
                 f">= 2: {_num(share, '.0%')}")
    return "\n".join(lines)


def _row(ref: str | None, ev: dict | None) -> str:
    if ev is None:
        return f"  {'-':>2} {_clip(ref, 34):<34} {'(not heard)':<34} {'-':<44} {'-':>7} {'-':>9}"
    cached = (f"{ev['cached_prompt_tokens']}/{ev['prompt_tokens']}"
              if "prompt_tokens" in ev else "-")
    first = f"{ev['first_token_s']:.2f}s" if "first_token_s" in ev else "-"
    answer = ev.get("answer", "(" + ev.get("skipped", "") + ")")
    return (f"  {ev['utterance']:>2} {_clip(ref or '-', 34):<34} {_clip(ev['transcript'], 34):<34} "
            f"{_clip(answer, 44):<44} {first:>7} {cached:>9}")


def _num(value: float, spec: str, unit: str = "") -> str:
    """A number for a table, "-" when there is none (NaN: no answered turns)."""
    return "-" if math.isnan(value) else f"{value:{spec}}{unit}"


SPLIT_KEYS = ("vad_s", "asr_queue_s", "asr_s", "turn_wait_s", "engine_queue_s", "prefill_s",
              "first_token_s", "answer_s", "total_s")


def latency_split(events: list[dict]) -> dict[str, dict[str, float]]:
    """p50 / p95 / mean of each latency component over all answered utterances."""
    answered = [ev for ev in events if "first_token_s" in ev]
    out = {}
    for key in SPLIT_KEYS:
        xs = [ev[key] for ev in answered if key in ev]
        out[key] = {"p50": percentile(xs, 50), "p95": percentile(xs, 95),
                    "mean": sum(xs) / len(xs) if xs else math.nan}
    return out


def split_table(split: dict[str, dict[str, float]]) -> str:
    lines = [f"  {'component':<16} {'p50':>7} {'p95':>7} {'mean':>7}"]
    for key, s in split.items():
        cells = (_num(s[q], ".2f", "s") for q in ("p50", "p95", "mean"))
        lines.append(f"  {key:<16} " + " ".join(f"{c:>7}" for c in cells))
    return "\n".join(lines)
