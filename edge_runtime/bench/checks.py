"""Up-front checks of `bench` arguments, so bad input fails before a model loads or a run starts.

Each check raises `InputError` naming the flag and what to change; nothing here imports torch
(bench modules are imported when the parser is built).
"""

from __future__ import annotations

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
    def run_checked(args) -> int:
        check_outputs(args)
        return run(args)

    run_checked.__wrapped__ = run
    return run_checked
