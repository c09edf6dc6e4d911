"""Up-front checks of `bench` arguments, so bad input fails before a model loads or a run starts.

Each check raises `InputError` naming the flag and what to change; nothing here imports torch
(bench modules are imported when the parser is built).
"""

from __future__ import annotations

import functools
from pathlib import Path

from edge_runtime.errors import InputError
from edge_runtime.paths import check_output_file, same_file

# Flags of bench subcommands that name a file the run writes at its end.
OUTPUT_FLAGS = ("json", "plot")
# Flags that name a file the run reads: an output written over one would destroy it.
INPUT_FLAGS = ("trace",)
# Image formats --plot writes (matplotlib picks the format from the extension).
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".eps", ".ps")


def check_outputs(args) -> None:
    """Every output file the run will write can be written, is named once, overwrites no input
    and (--plot) names an image format matplotlib writes; checked before any work."""
    written: list[tuple[str, str]] = []  # (flag, path)
    for name in OUTPUT_FLAGS:
        path = getattr(args, name, None)
        if path is None:
            continue
        if not str(path):
            raise InputError(f"--{name} needs a file name")
        check_output_file(path, f"--{name}")
        if name == "plot" and Path(path).suffix.lower() not in PLOT_SUFFIXES:
            raise InputError(f"--plot {path}: end the file name with the image format to write "
                             f"({', '.join(PLOT_SUFFIXES)})")
        for other, other_path in written:
            if same_file(path, other_path):
                raise InputError(f"--{other} and --{name} name the same file {path}; give each "
                                 "its own")
        written.append((name, path))
    for name in INPUT_FLAGS:
        path = getattr(args, name, None)
        for out, out_path in written if path else ():
            if same_file(path, out_path):
                raise InputError(f"--{out} {out_path} is the --{name} file this run reads; write "
                                 "the results to another file")


def checked(run):
    """`run` preceded by check_outputs: the wrapper every bench subcommand's func goes through."""
    @functools.wraps(run)
    def run_checked(args) -> int:
        check_outputs(args)
        return run(args)

    return run_checked


def parse_int_list(text: str, flag: str) -> list[int]:
    """`"1,2,5"` -> [1, 2, 5]; an empty item (`1,,5`, `1,`), a non-integer, a value < 1 or a value
    given twice (it would run twice and its rows be merged) is refused."""
    items = [x.strip() for x in text.split(",")]
    try:
        values = [int(x) for x in items]
    except ValueError as exc:
        raise InputError(f"{flag} takes comma-separated positive integers (e.g. 1,2,5), "
                         f"got {text!r}") from exc
    if min(values) < 1:
        raise InputError(f"{flag} needs positive integers, got {text!r}")
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise InputError(f"{flag} lists {', '.join(map(str, twice))} more than once; give each "
                         "value once")
    return values


def check_context(model: str, tokens: int, what: str) -> None:
    """`tokens` positions fit in the model's context (from config.json, no weights loaded); a
    request that hits the limit stops early and would time steps that do nothing (`what` names
    the flags that make up `tokens`)."""
    # start-up time: imports torch
    from edge_runtime.model.loader import read_model_config, resolve_model_folder

    ctx = read_model_config(resolve_model_folder(model, progress=None)).max_position_embeddings
    if tokens > ctx:
        raise InputError(f"{what}: {tokens} tokens, more than the model's context of {ctx}; "
                         "choose fewer")


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
