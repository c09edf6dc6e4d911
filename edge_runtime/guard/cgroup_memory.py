"""The service's memory cgroup as the kernel accounts it: working set against the tightest limit.

  working set = usage - inactive file pages
                v2: memory.current - memory.stat `inactive_file`
                v1: memory.usage_in_bytes - memory.stat `total_inactive_file`
  limit       = per cgroup on the path from ours to the root of the hierarchy:
                v2: the lower of memory.max and memory.high (the kernel throttles and reclaims
                    hard at memory.high, so pressure starts there); v1: memory.limit_in_bytes,
                    and our own `hierarchical_memory_limit` (memory.stat), which also sees
                    ancestors a container's cgroup namespace hides
  fraction    = the highest working set / limit over those cgroups: a parent's limit binds on
                the sum of its children, so it is compared with the parent's own usage

Clean page cache (inactive file) is what the kernel reclaims first; counting it read one process
reading a 900 MiB file as critical pressure. kubelet and cAdvisor define the container working set
the same way (cadvisor container/libcontainer/handler.go: `workingSet = usage - inactive_file`,
`total_inactive_file` on v1).

Invariants: a missing file means "not there" (no limit, no stat: inactive 0); a file that exists
but is not a byte count raises TelemetryError naming it. A reading always describes one cgroup's
usage with that cgroup's limit (never our usage against a parent's limit, except the v1
hierarchical limit of hidden ancestors, where ours is the only usage visible: a lower bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edge_runtime.errors import EdgeError

UNLIMITED = 1 << 60  # v1 reports "no limit" as a page-rounded 2**63 - 1


class TelemetryError(EdgeError):
    """A telemetry source gave no usable memory reading."""


@dataclass(frozen=True)
class CgroupReading:
    version: str  # "v1" | "v2"
    path: str  # the cgroup whose usage and limit these are, e.g. /system.slice
    usage_bytes: int
    inactive_file_bytes: int
    limit_bytes: int | None  # None: no limit anywhere on the path
    limit_file: str = ""  # memory.max/.high, memory.limit_in_bytes, hierarchical_memory_limit

    @property
    def working_set_bytes(self) -> int:
        return max(self.usage_bytes - self.inactive_file_bytes, 0)

    @property
    def fraction(self) -> float | None:
        if not self.limit_bytes:
            return None
        return self.working_set_bytes / self.limit_bytes


class CgroupMemory:
    """One process's memory cgroup, found once; `read()` walks its path to the root each time."""

    def __init__(self, version: str, mount: Path, rel: str) -> None:
        self.version, self.mount, self.rel = version, mount, rel.strip("/")

    @classmethod
    def locate(cls, root: Path, proc_cgroup: Path) -> "CgroupMemory | None":
        """From /proc/<pid>/cgroup: v2 (`0::/path`, memory controller) or v1 (`N:memory:/path`).
        A path not visible under the mount (a container's namespace) falls back to its root."""
        try:
            lines = proc_cgroup.read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            if line.count(":") < 2:  # not "hierarchy:controllers:path"
                continue
            hier, controllers, path = line.split(":", 2)
            rel = path.strip("/")
            if hier == "0" and (root / "cgroup.controllers").exists():
                for r in (rel, ""):
                    if (root / r / "memory.current").exists():
                        return cls("v2", root, r)
            if "memory" in controllers.split(","):
                for r in (rel, ""):
                    if (root / "memory" / r / "memory.usage_in_bytes").exists():
                        return cls("v1", root / "memory", r)
        return None

    @property
    def directory(self) -> Path:
        return self.mount / self.rel

    def levels(self) -> list[tuple[str, Path]]:
        """(cgroup path, directory) from ours up to the root of the hierarchy."""
        parts = self.rel.split("/") if self.rel else []
        return [("/" + "/".join(parts[:i]), self.mount.joinpath(*parts[:i]))
                for i in range(len(parts), -1, -1)]

    def read(self) -> CgroupReading:
        levels = [r for r in (self._read_level(name, d) for name, d in self.levels()) if r]
        if not levels:
            usage = "memory.current" if self.version == "v2" else "memory.usage_in_bytes"
            raise TelemetryError(f"{self.directory}: no readable {usage}")
        own = levels[0]
        if self.version == "v1":
            hidden = self._hierarchical_limit(own, levels)
            if hidden is not None:
                levels.append(hidden)
        limited = [r for r in levels if r.limit_bytes]
        if not limited:
            return own
        return max(limited, key=lambda r: (r.fraction, len(r.path)))  # a tie: the nearest

    def _read_level(self, name: str, d: Path) -> CgroupReading | None:
        v2 = self.version == "v2"
        usage = read_bytes(d / ("memory.current" if v2 else "memory.usage_in_bytes"))
        if usage is None:
            return None
        stat = read_stat(d / "memory.stat")
        inactive = stat.get("inactive_file" if v2 else "total_inactive_file", 0)
        candidates = [("memory.max", read_bytes(d / "memory.max")),
                      ("memory.high", read_bytes(d / "memory.high"))] if v2 else \
            [("memory.limit_in_bytes", read_bytes(d / "memory.limit_in_bytes"))]
        limits = [(n, v) for n, v in candidates if v is not None and v < UNLIMITED]
        limit_file, limit = min(limits, key=lambda x: x[1]) if limits else ("", None)
        return CgroupReading(self.version, name, usage, inactive, limit, limit_file)

    def _hierarchical_limit(self, own: CgroupReading, levels: list) -> CgroupReading | None:
        """v1: our memory.stat's hierarchical_memory_limit when it is below every limit we can
        see (an ancestor outside our view): compared with our own usage, the only one visible."""
        limit = read_stat(self.directory / "memory.stat").get("hierarchical_memory_limit")
        if limit is None or limit >= UNLIMITED:
            return None
        visible = [r.limit_bytes for r in levels if r.limit_bytes]
        if visible and min(visible) <= limit:
            return None
        return CgroupReading("v1", own.path + " (hierarchical)", own.usage_bytes,
                             own.inactive_file_bytes, limit, "hierarchical_memory_limit")


def read_bytes(path: Path) -> int | None:
    """A cgroup byte count; None if the file is absent or says "max"."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    if not text.isdigit():
        raise TelemetryError(f"{path}: expected a byte count or 'max', got {text[:40]!r}")
    return int(text)


def read_stat(path: Path) -> dict[str, int]:
    """memory.stat as {key: value}; {} if absent. A line that is not `key integer` is an error."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or not parts[1].isdigit():
            raise TelemetryError(f"{path}: expected 'key bytes' lines, got {line[:60]!r}")
        out[parts[0]] = int(parts[1])
    return out
