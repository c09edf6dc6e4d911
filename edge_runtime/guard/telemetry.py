"""Memory telemetry sources for the guard: jtop, /proc/meminfo, each with the service's cgroup.

Invariants:
- Every source returns a `MemorySample` in bytes; `used_fraction` is the single pressure number the
  guard compares with its thresholds: the higher of the machine's (1 - available/total) and the
  cgroup's working set over its tightest limit (guard/cgroup_memory.py), so a service capped by
  MemoryHigh=/MemoryMax= (or by a parent slice or container) feels pressure from its cgroup before
  the device runs out. Neither counts clean page cache: MemAvailable leaves reclaimable memory out,
  jtop's RAM `used` is MemTotal - MemFree - Buffers - Cached - SReclaimable, and the cgroup's
  working set is usage minus inactive file pages.
- `open_source()` prefers jtop only when its service answers (on a Jetson, RAM.shared = NvMap, the
  GPU's share of the unified RAM, is reported beside the fraction); any failure falls back to
  /proc/meminfo, and the chosen source's `name` is reported in /metrics and /health.
- Reading a source never raises for a missing cgroup file: the cgroup part is simply absent.
- A reading that is not a memory reading (no MemTotal, zero total, no MemAvailable/MemFree, a
  garbage cgroup file) raises `TelemetryError` naming the file and field; it is never turned into
  a number (a missing MemAvailable read as 0 bytes free would preempt every sequence).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from edge_runtime.guard.cgroup_memory import CgroupMemory, CgroupReading, TelemetryError

log = logging.getLogger(__name__)
__all__ = ["MemorySample", "TelemetryError", "ProcMeminfoSource", "JtopSource", "ScriptedSource",
           "open_source", "parse_meminfo"]


@dataclass(frozen=True)
class MemorySample:
    total_bytes: int
    available_bytes: int
    swap_used_bytes: int = 0
    gpu_shared_bytes: int = 0  # NvMap on Jetson (jtop RAM.shared / NvMapMemUsed); 0 elsewhere
    cgroup: CgroupReading | None = None
    temperatures_c: dict[str, float] = field(default_factory=dict)
    power_mw: float | None = None

    @property
    def machine_fraction(self) -> float:
        assert self.total_bytes > 0, self.total_bytes
        return 1.0 - self.available_bytes / self.total_bytes

    @property
    def cgroup_fraction(self) -> float | None:
        return self.cgroup.fraction if self.cgroup is not None else None

    @property
    def used_fraction(self) -> float:
        frac = max(self.machine_fraction, self.cgroup_fraction or 0.0)
        return min(max(frac, 0.0), 1.0)

    def inputs(self) -> dict:
        """Every number the fraction is made of, for /metrics and /v1/stats (None: not known)."""
        c = self.cgroup
        return {
            "used_fraction": self.used_fraction,
            "machine_used_fraction": self.machine_fraction,
            "cgroup_used_fraction": self.cgroup_fraction,
            "total_bytes": self.total_bytes,
            "available_bytes": self.available_bytes,
            "gpu_shared_bytes": self.gpu_shared_bytes,
            "swap_used_bytes": self.swap_used_bytes,
            "cgroup_usage_bytes": c.usage_bytes if c else None,
            "cgroup_inactive_file_bytes": c.inactive_file_bytes if c else None,
            "cgroup_working_set_bytes": c.working_set_bytes if c else None,
            "cgroup_limit_bytes": c.limit_bytes if c else None,
        }

    def limit_label(self) -> str:
        """Which cgroup file binds, e.g. "/system.slice memory.high" ("" when none)."""
        c = self.cgroup
        return f"{c.version} {c.path} {c.limit_file}" if c is not None and c.limit_bytes else ""


class ScriptedSource:
    """Returns the given used fractions (or samples) in order, then repeats the last one. Tests."""

    name = "scripted"

    def __init__(self, values, total_bytes: int = 8 << 30) -> None:
        self.values = list(values)
        assert self.values, "a scripted source needs at least one value"
        self.total_bytes = total_bytes
        self.reads = 0

    def push(self, value) -> None:
        self.values.append(value)

    def read(self) -> MemorySample:
        value = self.values[min(self.reads, len(self.values) - 1)]
        self.reads += 1
        if isinstance(value, MemorySample):
            return value
        avail = int(self.total_bytes * (1.0 - float(value)))
        return MemorySample(total_bytes=self.total_bytes, available_bytes=avail)


class ProcMeminfoSource:
    """/proc/meminfo MemAvailable plus the cgroup's working set and tightest limit (v2 or v1)."""

    name = "proc-meminfo"

    def __init__(self, meminfo: str = "/proc/meminfo", cgroup_root: str = "/sys/fs/cgroup",
                 proc_cgroup: str = "/proc/self/cgroup") -> None:
        self.meminfo = Path(meminfo)
        self.cgroup = CgroupMemory.locate(Path(cgroup_root), Path(proc_cgroup))
        if self.cgroup is not None:
            self.name = f"proc-meminfo+cgroup-{self.cgroup.version}"

    def read(self) -> MemorySample:
        info = parse_meminfo(self.meminfo.read_text())
        total = info.get("MemTotal", 0)
        available = info.get("MemAvailable", info.get("MemFree"))
        if total <= 0 or available is None or not 0 <= available <= total:
            raise TelemetryError(
                f"{self.meminfo}: need MemTotal > 0 and MemAvailable (or MemFree) between 0 and "
                f"it, in kB; got MemTotal={info.get('MemTotal')}, MemAvailable="
                f"{info.get('MemAvailable')}, MemFree={info.get('MemFree')} bytes")
        return MemorySample(
            total_bytes=total,
            available_bytes=available,
            swap_used_bytes=info.get("SwapTotal", 0) - info.get("SwapFree", 0),
            gpu_shared_bytes=info.get("NvMapMemUsed", 0),
            cgroup=self.cgroup.read() if self.cgroup is not None else None,
        )


class JtopSource:
    """jtop (jetson-stats) client; RAM values are KiB in jtop, converted to bytes here."""

    name = "jtop"

    def __init__(self, jetson, cgroup: CgroupMemory | None = None) -> None:
        self.jetson = jetson  # a started jtop.jtop instance
        self.cgroup = cgroup
        if cgroup is not None:
            self.name = f"jtop+cgroup-{cgroup.version}"

    @classmethod
    def connect(cls) -> "JtopSource":
        from jtop import jtop  # jetson-stats; raises JtopException when the service is down

        jetson = jtop()
        jetson.start()
        return cls(jetson, CgroupMemory.locate(Path("/sys/fs/cgroup"), Path("/proc/self/cgroup")))

    def read(self) -> MemorySample:
        """jtop's RAM `used` leaves page cache out already (MemTotal - MemFree - Buffers -
        Cached - SReclaimable, jtop/core/memory.py); NvMap (`shared`) is part of it on Orin,
        reported beside it as the GPU's share."""
        self.jetson.ok(spin=True)
        mem = self.jetson.memory
        ram, swap = mem["RAM"], mem.get("SWAP", {})
        used_kib = ram["used"]
        if not ram["tot"] > 0:
            raise TelemetryError(f"jtop reports a RAM total of {ram['tot']!r} KiB")
        temps = {k: float(v["temp"]) for k, v in (self.jetson.temperature or {}).items()
                 if v.get("online", True) and v.get("temp", -256) > -256}
        power = (self.jetson.power or {}).get("tot", {}).get("power")
        return MemorySample(
            total_bytes=ram["tot"] * 1024,
            available_bytes=max(ram["tot"] - used_kib, 0) * 1024,
            swap_used_bytes=swap.get("used", 0) * 1024,
            gpu_shared_bytes=ram.get("shared", 0) * 1024,
            cgroup=self.cgroup.read() if self.cgroup is not None else None,
            temperatures_c=temps,
            power_mw=float(power) if power is not None else None,
        )

    def close(self) -> None:
        self.jetson.close()


def open_source(prefer_jtop: bool = True):
    """jtop if its service answers, else /proc/meminfo (+cgroup). Logs which one is used."""
    if prefer_jtop and os.path.exists("/run/jtop.sock"):
        source = None
        try:
            source = JtopSource.connect()
            source.read()
            log.info("memory guard telemetry: jtop")
            return source
        except Exception as exc:  # jtop raises JtopException, OSError, version mismatches...
            log.warning("jtop service present but unusable (%s); using /proc/meminfo", exc)
            if source is not None:  # connected, but the first read failed: do not leak its thread
                try:
                    source.close()
                except Exception:  # closing a half-broken client: nothing more to do
                    log.debug("closing the unusable jtop client failed", exc_info=True)
    source = ProcMeminfoSource()
    log.info("memory guard telemetry: %s", source.name)
    return source


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> {key: bytes} (values there are KiB; HugePages_* counts are kept as is).

    A line without an integer value is skipped; the fields the guard needs are checked by the reader.
    """
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        value = int(parts[0])
        out[key] = value * 1024 if len(parts) > 1 and parts[1] == "kB" else value
    return out
