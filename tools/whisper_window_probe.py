"""Can Whisper tiny.en's encoder cost per command be cut? Word error rate and seconds per command
on the 47 spoken commands of voice/command_set.py (each home's device and action names as
`hotwords`, greedy, as voice/asr.py), three ways:

- `--window 30`: faster-whisper as the voice loop runs it (the audio padded to Whisper's 30 s
  window: the encoder's cost does not shrink with the command);
- `--window S` (S < 30): the audio padded with silence to S seconds and the encoder run on those
  S seconds only (CTranslate2 takes a shorter mel input; whisper.cpp's `audio_ctx`);
- `--pack N`: N commands, 1 s of silence apart, in one 30 s window, one encoder run for all N;
  the words are given back to their command by their timestamps (`word_timestamps`);
- `--batch N`: the encoder alone, N commands' 30 s windows in one batched call against N calls
  of one (what batching several streams' recognitions would save): seconds per window.

    .venv/bin/python tools/whisper_window_probe.py --window 30 --window 10 --pack 5 --batch 5

Prints one line per command and a summary per setting. A lab probe: nothing here is in the
product, which keeps the 30 s window (docs/voice.md, "Measured: five satellites").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.audio import pad_or_trim

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/: source_tree
from source_tree import import_edge_runtime  # noqa: E402

import_edge_runtime()  # the installed package, or the checkout's where it is not installed
from edge_runtime.voice.asr import default_whisper_folder  # noqa: E402
from edge_runtime.voice.command_set import COMMANDS, HOMES, build_command_wavs  # noqa: E402
from edge_runtime.voice.prompting import load_system_prompt  # noqa: E402
from edge_runtime.voice.report import wer  # noqa: E402
from edge_runtime.voice.wav_file import SAMPLE_RATE, read_wav  # noqa: E402

GAP_S = 1.0


class FittedWindowWhisper(WhisperModel):
    """faster-whisper pads every segment's mel features with zero columns to 3000 frames; this
    encoder drops those columns (a real mel column is never all zeros), so the audio's own
    length (padded with real silence by the caller) is what is encoded, while `fitted` is set."""

    fitted = False

    def encode(self, features):
        if not self.fitted:
            return super().encode(features)
        columns = np.flatnonzero(np.any(features.reshape(-1, features.shape[-1]) != 0, axis=0))
        frames = int(columns[-1]) + 1 if len(columns) else 2
        return super().encode(features[..., : frames + frames % 2])  # the conv has stride 2


def transcribe(model, audio: np.ndarray, hint: str, **options) -> list:
    segments, _ = model.transcribe(audio, language="en", beam_size=1,
                                   condition_on_previous_text=False, vad_filter=False,
                                   hotwords=hint, **options)
    return list(segments)


def by_window(model, audios, hints, window_s: float) -> list[str]:
    model.fitted = window_s < 30
    texts = []
    for command, audio in zip(COMMANDS, audios):
        if window_s < 30:
            silence = max(0, int(window_s * SAMPLE_RATE) - len(audio))
            audio = np.concatenate([audio, np.zeros(silence, np.float32)])
        start = time.perf_counter()
        segments = transcribe(model, audio, hints[command.home], without_timestamps=True)
        texts.append(" ".join(s.text.strip() for s in segments).strip())
        print(f"window {window_s:g}: {time.perf_counter() - start:.2f} s {texts[-1]!r}",
              flush=True)
    return texts


def packed(model, audios, hints, n: int) -> list[str]:
    hint = ", ".join(hints.values())
    model.fitted = False
    texts = []
    for first in range(0, len(audios), n):
        group, spans, parts, offset = audios[first:first + n], [], [], 0
        for audio in group:
            spans.append((offset / SAMPLE_RATE, (offset + len(audio)) / SAMPLE_RATE))
            parts += [audio, np.zeros(int(GAP_S * SAMPLE_RATE), np.float32)]
            offset += len(audio) + int(GAP_S * SAMPLE_RATE)
        start = time.perf_counter()
        words = [w for s in transcribe(model, np.concatenate(parts), hint, word_timestamps=True)
                 for w in s.words]
        heard = [[] for _ in group]
        for word in words:  # to the command whose span holds (or is nearest to) its middle
            middle = (word.start + word.end) / 2
            k = min(range(len(group)), key=lambda i: max(spans[i][0] - middle,
                                                         middle - spans[i][1], 0))
            heard[k].append(word.word)
        texts += ["".join(h).strip() for h in heard]
        print(f"pack {n}: {time.perf_counter() - start:.2f} s {texts[-len(group):]}", flush=True)
    return texts


def batched(model, audios, n: int, repeats: int = 3) -> dict:
    """Encoder seconds per window: N windows in one call, and one window per call."""
    model.fitted = False
    windows = [pad_or_trim(model.feature_extractor(a)) for a in audios[:n]]  # [80, 3000] each
    one, many = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for w in windows:
            model.encode(w)
        one.append((time.perf_counter() - start) / n)
        start = time.perf_counter()
        model.encode(np.stack(windows))
        many.append((time.perf_counter() - start) / n)
    result = {"setting": f"encoder, batch {n}", "s_per_window_batched": round(min(many), 3),
              "s_per_window_alone": round(min(one), 3)}
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, action="append", default=[],
                        help="encoder window in seconds (30: as the voice loop); repeatable")
    parser.add_argument("--pack", type=int, action="append", default=[],
                        help="commands per 30 s window; repeatable")
    parser.add_argument("--batch", type=int, action="append", default=[],
                        help="windows per batched encoder call; repeatable")
    parser.add_argument("--commands", type=int, default=len(COMMANDS),
                        help=f"the first N commands only (default all {len(COMMANDS)})")
    args = parser.parse_args()
    model = FittedWindowWhisper(str(default_whisper_folder()), device="cpu",
                                compute_type="int8", cpu_threads=1)
    hints = {home: load_system_prompt(path).vocabulary for home, path in HOMES.items()}
    audios = [read_wav(p) for p in build_command_wavs()][: args.commands]
    runs = [(f"window {w:g} s", lambda w=w: by_window(model, audios, hints, w))
            for w in args.window]
    runs += [(f"{n} per window", lambda n=n: packed(model, audios, hints, n)) for n in args.pack]
    for n in args.batch:
        batched(model, audios, n)
    for name, run in runs:
        start = time.perf_counter()
        texts = run()
        seconds = (time.perf_counter() - start) / len(texts)
        print(json.dumps({"setting": name, "wer": round(wer(
            [(c.text, t) for c, t in zip(COMMANDS, texts)]), 4),
            "s_per_command": round(seconds, 3)}), flush=True)


if __name__ == "__main__":
    main()
