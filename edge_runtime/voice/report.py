"""Word error rate (with text normalisation), percentiles and the per-stream tables of the voice
loop. Pure functions over the loop's events: no audio, no model.

Normalisation (applied to reference and hypothesis alike): lower case, numbers written as words
("21" -> "twenty one", 0..999999), "%" -> "percent", hyphens and punctuation -> spaces,
apostrophes removed ("what's" -> "whats"). WER = word-level Levenshtein distance / reference words.
"""

from __future__ import annotations

import math
import re

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
    """One stream's turns: command, transcript, answer, latency and cache use."""
    lines = [f"stream {stream}"]
    head = f"  {'#':>2} {'command':<34} {'transcript':<34} {'answer':<44} {'1st tok':>7} {'cached':>9}"
    lines.append(head)
    for ev in events:
        i = ev["utterance"]
        ref = references[i] if references and i < len(references) else "-"
        cached = (f"{ev['cached_prompt_tokens']}/{ev['prompt_tokens']}"
                  if "prompt_tokens" in ev else "-")
        first = f"{ev['first_token_s']:.2f}s" if "first_token_s" in ev else "-"
        answer = ev.get("answer", "(" + ev.get("skipped", "") + ")")
        lines.append(f"  {i:>2} {_clip(ref, 34):<34} {_clip(ev['transcript'], 34):<34} "
                     f"{_clip(answer, 44):<44} {first:>7} {cached:>9}")
    firsts = [ev["first_token_s"] for ev in events if "first_token_s" in ev]
    later = [ev for ev in events if ev["utterance"] > 0 and "prompt_tokens" in ev]
    prompt = sum(e["prompt_tokens"] for e in later)
    share = sum(e["cached_prompt_tokens"] for e in later) / prompt if prompt else math.nan
    lines.append(f"  end of speech -> first token: p50 {_num(percentile(firsts, 50), '.2f', 's')}  "
                 f"p95 {_num(percentile(firsts, 95), '.2f', 's')};  cached prompt share, turns "
                 f">= 2: {_num(share, '.0%')}")
    return "\n".join(lines)


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
