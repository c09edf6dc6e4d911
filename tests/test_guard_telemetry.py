"""Telemetry sources on synthetic /proc and cgroup trees, and jtop's data layout (KiB -> bytes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edge_runtime.guard.telemetry import (JtopSource, ProcMeminfoSource, TelemetryError,
                                          parse_meminfo)

MEMINFO = """MemTotal:        8000000 kB
MemFree:          500000 kB
MemAvailable:    2000000 kB
SwapTotal:       4000000 kB
SwapFree:        3000000 kB
NvMapMemUsed:     700000 kB
HugePages_Total:       0
"""


def test_parse_meminfo_converts_kib_and_keeps_counts():
    info = parse_meminfo(MEMINFO)
    assert info["MemTotal"] == 8000000 * 1024 and info["HugePages_Total"] == 0


def _tree(tmp_path, version: str, current: str, limit: str):
    tmp_path.mkdir(parents=True, exist_ok=True)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    root = tmp_path / "cgroup"
    if version == "v2":
        d = root / "system.slice/edge-runtime.service"
        d.mkdir(parents=True)
        (root / "cgroup.controllers").write_text("memory\n")
        (d / "memory.current").write_text(current)
        (d / "memory.max").write_text(limit)
        proc = "0::/system.slice/edge-runtime.service\n"
    else:
        d = root / "memory/svc"
        d.mkdir(parents=True)
        (d / "memory.usage_in_bytes").write_text(current)
        (d / "memory.limit_in_bytes").write_text(limit)
        proc = "5:pids:/svc\n4:memory:/svc\n0::/\n"
    (tmp_path / "proc_cgroup").write_text(proc)
    return ProcMeminfoSource(str(meminfo), str(root), str(tmp_path / "proc_cgroup"))


def test_proc_meminfo_with_cgroup_v2_limit(tmp_path):
    src = _tree(tmp_path, "v2", "3000000000\n", "4000000000\n")
    s = src.read()
    assert src.name == "proc-meminfo+cgroup-v2"
    assert s.available_bytes == 2000000 * 1024 and s.gpu_shared_bytes == 700000 * 1024
    assert s.swap_used_bytes == 1000000 * 1024
    # device: 75% used; cgroup: 75% of its limit -> max of the two
    assert abs(s.used_fraction - 0.75) < 1e-9


def test_cgroup_tighter_than_device_v1_and_unlimited(tmp_path):
    s = _tree(tmp_path / "a", "v1", "3900000000\n", "4000000000\n").read()
    assert abs(s.used_fraction - 0.975) < 1e-9
    s = _tree(tmp_path / "b", "v1", "100\n", "9223372036854771712\n").read()  # v1 "no limit"
    assert s.cgroup.limit_bytes is None and abs(s.used_fraction - 0.75) < 1e-9
    s = _tree(tmp_path / "c", "v2", "100\n", "max\n").read()
    assert s.cgroup.limit_bytes is None and s.cgroup.usage_bytes == 100


def test_no_cgroup_file_means_meminfo_only(tmp_path):
    (tmp_path / "meminfo").write_text(MEMINFO)
    src = ProcMeminfoSource(str(tmp_path / "meminfo"), str(tmp_path / "none"),
                            str(tmp_path / "missing"))
    assert src.name == "proc-meminfo" and src.read().cgroup is None


class _FakeJetson:
    """The shape of jtop's data (jtop/core/memory.py, jtop.py): RAM values in KiB."""

    def __init__(self):
        self.memory = {"RAM": {"tot": 16000000, "used": 12000000, "free": 1000000,
                               "shared": 5000000, "cached": 2000000},
                       "SWAP": {"tot": 8000000, "used": 250000}}
        self.temperature = {"gpu": {"online": True, "temp": 61.5},
                            "tj": {"online": False, "temp": -256}}
        self.power = {"rail": {}, "tot": {"power": 14250, "avg": 13000}}
        self.spins = 0

    def ok(self, spin=False):
        self.spins += 1
        return True


def test_jtop_source_converts_units():
    jet = _FakeJetson()
    s = JtopSource(jet).read()
    assert jet.spins == 1
    assert s.total_bytes == 16000000 * 1024 and s.available_bytes == 4000000 * 1024
    assert s.gpu_shared_bytes == 5000000 * 1024 and s.swap_used_bytes == 250000 * 1024
    assert s.temperatures_c == {"gpu": 61.5} and s.power_mw == 14250.0
    assert abs(s.used_fraction - 0.75) < 1e-9


@pytest.mark.parametrize("meminfo", [
    "MemFree: 500000 kB\nMemAvailable: 2000000 kB\n",             # no MemTotal
    "MemTotal: 0 kB\nMemAvailable: 0 kB\n",                          # zero total
    "MemTotal: lots kB\nMemAvailable: 2000000 kB\n",                 # garbage total
    "MemTotal: 8000000 kB\nSwapTotal: 0 kB\n",                       # neither MemAvailable nor MemFree
    "MemTotal: 8000000 kB\nMemAvailable: -5 kB\n",                   # negative
    "MemTotal: 8000000 kB\nMemAvailable: 9000000 kB\n",              # more available than total
    "",
])
def test_unusable_meminfo_is_a_telemetry_error(tmp_path, meminfo):
    """Before: KeyError / ValueError / an AssertionError in used_fraction, or
    0 bytes available = 100% used (neither MemAvailable nor MemFree), which made the guard
    preempt every sequence."""
    (tmp_path / "meminfo").write_text(meminfo)
    src = ProcMeminfoSource(str(tmp_path / "meminfo"), str(tmp_path / "none"),
                            str(tmp_path / "missing"))
    with pytest.raises(TelemetryError, match="need MemTotal > 0 and MemAvailable"):
        src.read()


def test_meminfo_fallbacks_and_garbage_lines(tmp_path):
    text = "MemTotal: 8000000 kB\nMemFree: 2000000 kB\nBogus: x kB\nnot a line\n"
    (tmp_path / "meminfo").write_text(text)
    (tmp_path / "proc_cgroup").write_text("garbage\n\n0::/\n")
    src = ProcMeminfoSource(str(tmp_path / "meminfo"), str(tmp_path / "none"),
                            str(tmp_path / "proc_cgroup"))
    assert abs(src.read().used_fraction - 0.75) < 1e-9  # MemFree when MemAvailable is absent


def test_garbage_cgroup_file_is_a_telemetry_error(tmp_path):
    src = _tree(tmp_path, "v2", "3000000000\n", "lots\n")
    with pytest.raises(TelemetryError, match="memory.max: expected a byte count or 'max'"):
        src.read()


def test_jtop_zero_total_is_a_telemetry_error():
    jet = _FakeJetson()
    jet.memory["RAM"]["tot"] = 0
    with pytest.raises(TelemetryError, match="RAM total of 0"):
        JtopSource(jet).read()


def test_open_source_closes_a_jtop_client_whose_first_read_fails(monkeypatch):
    """jtop's service answers but its first reading fails: fall back to /proc/meminfo and close the
    client (a started jtop runs a thread)."""
    from edge_runtime.guard import telemetry

    closed = []

    class BrokenJtop:
        def read(self):
            raise TelemetryError("jtop reports a RAM total of 0 KiB")

        def close(self):
            closed.append(True)

    real_exists = telemetry.os.path.exists
    monkeypatch.setattr(telemetry.os.path, "exists",
                        lambda p: True if p == "/run/jtop.sock" else real_exists(p))
    monkeypatch.setattr(telemetry.JtopSource, "connect", classmethod(lambda cls: BrokenJtop()))
    source = telemetry.open_source()
    assert isinstance(source, ProcMeminfoSource) and closed == [True]
