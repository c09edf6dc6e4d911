"""Jetson columns for the benchmarks (peak RAM, NvMap share, average power, tokens/J, temperature).

Read through the memory guard's jtop client (edge_runtime.guard.telemetry.JtopSource) in a sampler
thread. Off a Jetson, or when the jtop service is not running, `JtopRecorder.open()` returns None and
a reason, and every column reads "unavailable" — never a made-up number.
"""

from __future__ import annotations

import os

from edge_runtime.bench.monitor import PeakSampler

JTOP_KEYS = ("jtop_peak_ram_bytes", "jtop_peak_nvmap_bytes", "jtop_avg_power_w",
             "jtop_tokens_per_j", "jtop_max_temp_c")


def unavailable_columns(reason: str) -> dict:
    cols: dict = {k: None for k in JTOP_KEYS}
    cols["jtop"] = f"unavailable: {reason}"
    return cols


class JtopRecorder:
    def __init__(self, source, interval_s: float = 0.5) -> None:
        self.source = source
        self.samples = []
        self._sampler = PeakSampler(self._probe, interval_s)

    @classmethod
    def open(cls) -> tuple["JtopRecorder | None", str]:
        if not os.path.exists("/run/jtop.sock"):
            return None, "no jtop service (/run/jtop.sock); not a Jetson or jtop not installed"
        try:
            from jtop import JtopException

            # optional library: its jtop source needs jetson-stats
            from edge_runtime.guard.telemetry import JtopSource
        except ImportError as exc:
            return None, f"jetson-stats not importable ({exc})"
        try:
            return cls(JtopSource.connect()), ""
        except JtopException as exc:
            return None, f"jtop refused the connection ({exc})"

    def _probe(self) -> float:
        sample = self.source.read()
        self.samples.append(sample)
        return float(sample.total_bytes - sample.available_bytes)

    def __enter__(self) -> "JtopRecorder":
        self._sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        self._sampler.stop()

    def columns(self, output_tokens: int, seconds: float) -> dict:
        assert self.samples, "JtopRecorder.columns() before any sample"
        powers = [s.power_mw / 1000 for s in self.samples if s.power_mw is not None]
        temps = [max(s.temperatures_c.values()) for s in self.samples if s.temperatures_c]
        avg_w = sum(powers) / len(powers) if powers else None
        return {
            "jtop": "ok",
            "jtop_peak_ram_bytes": self._sampler.peak,
            "jtop_peak_nvmap_bytes": max(s.gpu_shared_bytes for s in self.samples),
            "jtop_avg_power_w": avg_w,
            "jtop_tokens_per_j": output_tokens / (avg_w * seconds) if avg_w and seconds else None,
            "jtop_max_temp_c": max(temps) if temps else None,
        }

    def close(self) -> None:
        self.source.close()
