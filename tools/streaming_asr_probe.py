"""Can a streaming recognizer take recognition off a command's critical path? Whisper tiny.en
encodes a whole 30 s window once the utterance is cut (~0.7 s of one core per command here), so
five satellites queue behind each other (docs/voice.md, "Measured: five satellites"). A streaming
recognizer decodes while the person speaks and has its words a few milliseconds after the end.
The only one that installs offline with a model is CMU pocketsphinx (its wheel carries a US
English acoustic model, a general 3-gram language model and CMUdict). This probe runs the 47
spoken commands of voice/command_set.py through:

- `pocketsphinx-general`: pocketsphinx streaming (1,024-sample chunks as they would arrive) with
  its bundled general language model;
- `pocketsphinx-home`: the same with a 3-gram language model written from the home's YAML only
  (device names, rooms and the actions each device lists, phrasal verbs both ways, the integer
  ranges of the actions' parameters as number words, the worked examples): the home's
  vocabulary bias, as `hotwords` are Whisper's;
- `whisper`: Whisper tiny.en as the voice loop runs it (voice/asr.py, the home's names as
  hotwords), after the utterance.

    .venv/bin/python tools/streaming_asr_probe.py --out streaming_asr_probe.json

Per recognizer: word error rate over the 47 commands, the CPU seconds per second of audio while
streaming (real-time factor), and the milliseconds from the utterance's last sample to its words
(p50 / p95). A lab probe: the product keeps Whisper (docs/voice.md).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/: source_tree
from source_tree import import_edge_runtime  # noqa: E402

import_edge_runtime()  # the installed package, or the checkout's where it is not installed
from edge_runtime.bench.stats import percentile  # noqa: E402
from edge_runtime.voice.asr import make_recognizer  # noqa: E402
from edge_runtime.voice.command_set import COMMANDS, HOMES, build_command_wavs  # noqa: E402
from edge_runtime.voice.prompting import load_system_prompt  # noqa: E402
from edge_runtime.voice.report import normalize, number_words, word_errors  # noqa: E402
from edge_runtime.voice.wav_file import SAMPLE_RATE, read_wav  # noqa: E402

CHUNK = 1024  # samples handed to the decoder at a time (64 ms), as a satellite's audio arrives
PARTICLES = {"on", "off", "up", "down"}


def home_sentences(path: Path) -> list[list[str]]:
    """The language model's training text, from the home's YAML alone."""
    data = yaml.safe_load(path.read_text())
    out = []
    for device in data["devices"]:
        name = device["name"]
        out += [f"the {name}", f"the {name} in the {device['room']}"]
        for action in device.get("actions", []):
            words = action.split()
            out += [f"{action} the {name}", f"please {action} the {name}", f"{name} {action}"]
            if len(words) == 2 and words[1] in PARTICLES:  # "turn on" -> "turn the X on"
                out += [f"{words[0]} the {name} {words[1]}", f"switch {words[1]} the {name}"]
            if words[0] == "is":  # "is locked" -> "is the X locked"
                out.append(f"is the {name} {' '.join(words[1:])}")
            if words[0] == "volume":  # "volume up" -> "turn the volume up"
                out += [f"turn the volume {words[1]}", f"turn the {name} {words[1]}"]
            if words[0] in ("set", "get") and len(words) == 2:  # "get temperature"
                room = device["room"]
                out += [f"what is the {words[1]}", f"what is the {words[1]} in the {room}",
                        f"set the {name}", f"set the {words[1]}"]
    for action in data["actions"]:
        for pname, schema in (action.get("parameters", {}).get("properties") or {}).items():
            if schema.get("type") == "integer":
                for n in range(schema.get("minimum", 0), schema.get("maximum", 100) + 1):
                    out.append(f"to {number_words(n)} {pname}")
    out += [example["say"] for example in data.get("examples", [])]
    return [normalize(s) for s in out]  # as the word error rate reads them ("20" -> "twenty")


def write_arpa(sentences: list[list[str]], path: Path, order: int = 3, discount: float = 0.5):
    """A back-off n-gram model with absolute discounting, in ARPA text."""
    counts = [collections.Counter() for _ in range(order)]
    for s in sentences:
        words = ["<s>", *s, "</s>"]
        for n in range(1, order + 1):
            for i in range(len(words) - n + 1):
                counts[n - 1][tuple(words[i:i + n])] += 1
    prob = [{} for _ in range(order)]
    backoff = [{} for _ in range(order)]
    total = sum(c for g, c in counts[0].items() if g != ("<s>",))
    prob[0] = {g: (c / total if g != ("<s>",) else 0.0) for g, c in counts[0].items()}
    for n in range(2, order + 1):
        by_history = collections.defaultdict(list)
        for g, c in counts[n - 1].items():
            by_history[g[:-1]].append((g, c))
        for history, seen in by_history.items():
            total = sum(c for _, c in seen)
            for g, c in seen:
                prob[n - 1][g] = (c - discount) / total
            lower = sum(prob[n - 2].get(g[1:], 0.0) for g, _ in seen)
            backoff[n - 2][history] = discount * len(seen) / total / max(1e-9, 1 - lower)
    lines = ["\\data\\", *(f"ngram {n + 1}={len(prob[n])}" for n in range(order))]
    for n in range(order):
        lines += ["", f"\\{n + 1}-grams:"]
        for g, p in prob[n].items():
            row = f"{math.log10(p) if p > 0 else -99:.4f}\t{' '.join(g)}"
            if n < order - 1 and g in backoff[n]:
                row += f"\t{math.log10(backoff[n][g]):.4f}"
            lines.append(row)
    path.write_text("\n".join([*lines, "", "\\end\\", ""]))


class StreamingSphinx:
    def __init__(self, lm: Path | None):
        from pocketsphinx import Decoder

        kwargs = {"lm": str(lm)} if lm else {}
        self.decoder = Decoder(samprate=SAMPLE_RATE, loglevel="FATAL", **kwargs)

    def run(self, audio: np.ndarray) -> tuple[str, float, float]:
        """-> (words, CPU seconds while streaming, seconds from the last sample to the words)."""
        pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
        d = self.decoder
        d.start_utt()
        start = time.process_time()
        for i in range(0, len(pcm), 2 * CHUNK):
            d.process_raw(pcm[i:i + 2 * CHUNK], full_utt=False)
        streamed = time.process_time() - start
        t = time.perf_counter()
        d.end_utt()
        hyp = d.hyp()
        return (hyp.hypstr if hyp else ""), streamed, time.perf_counter() - t


class AfterTheCut:
    def __init__(self, home: Path):
        self.recognizer = make_recognizer("whisper", hint=load_system_prompt(home).vocabulary)

    def run(self, audio: np.ndarray) -> tuple[str, float, float]:
        t = time.perf_counter()
        text = self.recognizer.transcribe(audio)
        return text, 0.0, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="streaming_asr_probe.json")
    args = ap.parse_args()
    wavs = build_command_wavs(progress=lambda m: print(m, file=sys.stderr))
    audio = [read_wav(w) for w in wavs]
    lm_dir = Path(tempfile.mkdtemp(prefix="streaming-asr-probe-"))
    for home, path in HOMES.items():
        write_arpa(home_sentences(path), lm_dir / f"{home}.arpa")
    makers = {
        "pocketsphinx-general": lambda home: StreamingSphinx(None),
        "pocketsphinx-home": lambda home: StreamingSphinx(lm_dir / f"{home}.arpa"),
        "whisper": lambda home: AfterTheCut(HOMES[home]),
    }
    summary, rows = [], []
    for name, make in makers.items():
        recognizers = {home: make(home) for home in HOMES}
        errors = words = 0
        cpu = seconds = 0.0
        ends = []
        for command, a in zip(COMMANDS, audio):
            text, streamed, end = recognizers[command.home].run(a)
            e, n = word_errors(command.text, text)
            errors, words = errors + e, words + n
            cpu, seconds = cpu + streamed, seconds + len(a) / SAMPLE_RATE
            ends.append(1e3 * end)
            rows.append({"recognizer": name, "said": command.text, "heard": text,
                         "end_ms": round(1e3 * end, 1)})
            print(f"{name:21} {e} {command.text!r:45} -> {text!r}")
        summary.append({"recognizer": name, "wer": errors / words,
                        "streaming_rtf": cpu / seconds if cpu else None,
                        "end_p50_ms": percentile(ends, 50), "end_p95_ms": percentile(ends, 95)})
    print("\n| recognizer | WER (47) | CPU s per audio s while streaming | end -> words p50 / "
          "p95 ms |\n|---|---:|---:|---:|")
    for s in summary:
        rtf = f"{s['streaming_rtf']:.3f}" if s["streaming_rtf"] is not None else "-"
        print(f"| {s['recognizer']} | {s['wer']:.1%} | {rtf} | {s['end_p50_ms']:.0f} / "
              f"{s['end_p95_ms']:.0f} |")
    Path(args.out).write_text(json.dumps({"summary": summary, "commands": rows}, indent=1))


if __name__ == "__main__":
    main()
