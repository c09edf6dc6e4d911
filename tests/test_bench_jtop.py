"""bench.jtop_cols: "unavailable" off a Jetson, and the column arithmetic on scripted samples."""

import os
import random

import pytest

from edge_runtime.bench.jtop_cols import JTOP_KEYS, JtopRecorder, unavailable_columns
from edge_runtime.guard.telemetry import MemorySample


class ScriptedSource:
    def __init__(self, samples):
        self.samples = list(samples)
        self.i = 0
        self.closed = False

    def read(self):
        s = self.samples[min(self.i, len(self.samples) - 1)]
        self.i += 1
        return s

    def close(self):
        self.closed = True


@pytest.mark.skipif(os.path.exists("/run/jtop.sock"), reason="a jtop service runs here (Jetson)")
def test_unavailable_off_jetson():
    rec, why = JtopRecorder.open()
    assert rec is None and "jtop" in why
    cols = unavailable_columns(why)
    assert cols["jtop"].startswith("unavailable") and all(cols[k] is None for k in JTOP_KEYS)


def test_columns_from_samples():
    rng = random.Random(7)
    gib = 2**30
    samples = [MemorySample(total_bytes=8 * gib, available_bytes=rng.randint(2, 6) * gib,
                            gpu_shared_bytes=rng.randint(1, 900) * 2**20,
                            temperatures_c={"cpu": rng.uniform(40, 60), "gpu": rng.uniform(40, 60)},
                            power_mw=rng.uniform(5000, 15000)) for _ in range(4)]
    rec = JtopRecorder(ScriptedSource(samples), interval_s=10.0)
    with rec:  # start + stop each take one sample: exactly the first two scripted samples
        pass
    cols = rec.columns(output_tokens=600, seconds=3.0)
    seen = rec.samples
    assert len(seen) == 2
    watts = sum(s.power_mw for s in seen) / 2 / 1000
    assert cols["jtop_avg_power_w"] == pytest.approx(watts)
    assert cols["jtop_tokens_per_j"] == pytest.approx(600 / (watts * 3.0))
    assert cols["jtop_peak_ram_bytes"] == max(s.total_bytes - s.available_bytes for s in seen)
    assert cols["jtop_peak_nvmap_bytes"] == max(s.gpu_shared_bytes for s in seen)
    assert cols["jtop_max_temp_c"] == max(max(s.temperatures_c.values()) for s in seen)
    rec.close()
    assert rec.source.closed
