"""A memory cgroup made under our own, to run a pressure episode in (needs root; v1 or v2).

`ChildCgroup.create(name)` makes `<our memory cgroup>/<name>`; `enter()` moves this process into
it (its children follow), `set_limit()` caps it, `leave()` moves back and `remove()` deletes it.
`CgroupUnavailable` says why when the machine does not allow it (not root, read-only cgroupfs,
cgroup v2 whose memory controller can be enabled neither below our cgroup, which holds processes,
nor below the hierarchy's root...).

Memory charged before `enter()` stays with the old cgroup (the kernel does not move charges on
migration by default), so a process enters before it allocates what it wants counted.
"""

from __future__ import annotations

import os
from pathlib import Path


class CgroupUnavailable(RuntimeError):
    """No child memory cgroup can be made here; the message says why."""


class ChildCgroup:
    def __init__(self, version: str, parent: Path, name: str, home: Path | None = None) -> None:
        self.version, self.parent, self.path = version, parent, parent / name
        self.home = home or parent  # where leave() moves a process back to

    @classmethod
    def create(cls, name: str, root: str = "/sys/fs/cgroup",
               proc_cgroup: str = "/proc/self/cgroup") -> "ChildCgroup":
        version, ours = _our_memory_cgroup(Path(root), Path(proc_cgroup))
        parent = _v2_parent(ours, Path(root)) if version == "v2" else ours
        child = cls(version, parent, name, home=ours)
        try:
            child.path.mkdir()
        except OSError as exc:
            raise CgroupUnavailable(f"cannot create {child.path}: {exc}") from None
        return child

    def set_limit(self, limit_bytes: int) -> None:
        name = "memory.max" if self.version == "v2" else "memory.limit_in_bytes"
        (self.path / name).write_text(str(int(limit_bytes)))

    def enter(self, pid: int = 0) -> None:
        (self.path / "cgroup.procs").write_text(str(pid or os.getpid()))

    def leave(self, pid: int = 0) -> None:
        (self.home / "cgroup.procs").write_text(str(pid or os.getpid()))

    def remove(self) -> None:
        if self.version == "v1" and (self.path / "memory.force_empty").exists():
            try:  # uncharge the page cache left behind, or rmdir leaves a zombie cgroup
                (self.path / "memory.force_empty").write_text("1")
            except OSError:
                pass
        self.path.rmdir()


def _our_memory_cgroup(root: Path, proc_cgroup: Path) -> tuple[str, Path]:
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError as exc:
        raise CgroupUnavailable(f"cannot read {proc_cgroup}: {exc}") from None
    for line in lines:
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(",") and (root / "memory").is_dir():
            d = root / "memory" / path.strip("/")
            if d.is_dir():
                return "v1", d
        if hier == "0" and (root / "cgroup.controllers").exists():
            d = root / path.strip("/")
            if d.is_dir() and "memory" in (d / "cgroup.controllers").read_text().split():
                return "v2", d
    raise CgroupUnavailable(f"no memory cgroup of ours is visible under {root} "
                            f"(/proc/self/cgroup: {' | '.join(lines)[:200]})")


def _v2_parent(ours: Path, root: Path) -> Path:
    """Our cgroup if its children can get the memory controller, else the hierarchy's root (exempt
    from v2's no-internal-process rule, which refuses +memory below a cgroup holding processes)."""
    errors = []
    for parent in dict.fromkeys((ours, root)):
        control = parent / "cgroup.subtree_control"
        try:
            if "memory" not in control.read_text().split():
                control.write_text("+memory")
            return parent
        except OSError as exc:
            errors.append(f"{control}: {exc}")
    raise CgroupUnavailable("cannot enable the memory controller for a child cgroup ("
                            + "; ".join(errors) + ")")
