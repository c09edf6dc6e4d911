"""`BusyLoad(n)`: n child processes that each spin on a core for as long as the block runs, the
co-located load of the benches' `--busy N` (another program on the device taking cores).

Each child is a plain `python -c` loop at normal priority with no affinity, so the kernel's
scheduler places it as it would any other program; the children are killed (by their own ids) and
reaped when the block ends, also when it ends with an exception.
"""

from __future__ import annotations

import subprocess

from edge_runtime.import_path import code_argv

SPIN = "while True:\n    pass\n"


class BusyLoad:
    def __init__(self, processes: int) -> None:
        if processes < 0:
            raise ValueError(f"busy processes must be >= 0, got {processes}")
        self.processes = processes
        self._children: list[subprocess.Popen] = []

    def __enter__(self) -> "BusyLoad":
        self._children = [subprocess.Popen(code_argv(SPIN), stdin=subprocess.DEVNULL)
                          for _ in range(self.processes)]
        return self

    def __exit__(self, *exc) -> None:
        for child in self._children:
            child.kill()
        for child in self._children:
            child.wait()
        self._children = []

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self._children]
