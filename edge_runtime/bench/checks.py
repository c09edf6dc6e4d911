"""Up-front checks of `bench` arguments, so bad input fails before a model loads or a run starts.

Each check raises `InputError` naming the flag and what to change; nothing here imports torch
(bench modules are imported when the parser is built).
"""

from __future__ import annotations

import functools

from edge_runtime.errors import InputError
from edge_runtime.paths import check_output_file

# Flags of bench subcommands that name a file the run writes at its end.
OUTPUT_FLAGS = ("json", "plot")


def check_outputs(args) -> None:
    """Every output file the run will write can be written (checked before any work)."""
    for name in OUTPUT_FLAGS:
        path = getattr(args, name, None)
        if path is not None:
            if not str(path):
                raise InputError(f"--{name} needs a file name")
            check_output_file(path, f"--{name}")


def checked(run):
    """`run` preceded by check_outputs: the wrapper every bench subcommand's func goes through."""
    @functools.wraps(run)
    def run_checked(args) -> int:
        check_outputs(args)
        return run(args)

    return run_checked


def parse_int_list(text: str, flag: str) -> list[int]:
    """`"1,2,5"` -> [1, 2, 5]; an empty item (`1,,5`, `1,`), a non-integer or a value < 1 is refused."""
    items = [x.strip() for x in text.split(",")]
    try:
        values = [int(x) for x in items]
    except ValueError as exc:
        raise InputError(f"{flag} takes comma-separated positive integers (e.g. 1,2,5), "
                         f"got {text!r}") from exc
    if min(values) < 1:
        raise InputError(f"{flag} needs positive integers, got {text!r}")
    return values


def check_min(args, **minimums: int) -> None:
    """Each named integer flag (when given) is at least its minimum: `check_min(args, repeat=1)`."""
    for name, low in minimums.items():
        value = getattr(args, name)
        if value is not None and value < low:
            flag = "--" + name.replace("_", "-")
            raise InputError(f"{flag} must be at least {low}, got {value}")


def check_fits_in_memory(nbytes: int, what: str) -> None:
    """Refuse up front a buffer larger than the memory available now (instead of a MemoryError,
    an allocator traceback or the OOM killer halfway through)."""
    import psutil

    available = psutil.virtual_memory().available
    if nbytes > available:
        raise InputError(f"{what} needs {nbytes / 2**30:.1f} GiB but {available / 2**30:.1f} GiB "
                         "of memory is available; choose smaller sizes")


def check_bandwidth_mib(size_mib: int) -> None:
    """--bandwidth-mib: a positive size whose two float tensors (source, copy) fit in memory."""
    if size_mib < 1:
        raise InputError(f"--bandwidth-mib must be at least 1, got {size_mib}")
    check_fits_in_memory(2 * size_mib * 2**20, f"--bandwidth-mib {size_mib}")
