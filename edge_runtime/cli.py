"""The `edge-runtime` command.

Each subcommand lives in its own module under `edge_runtime/commands/` and exposes
`register(subparsers)`, which adds its parser and sets `func=run(args) -> int`. Modules are found
by name, so adding a command never edits this file. Heavy imports (torch, transformers) happen
inside `run`, so `edge-runtime --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from edge_runtime import commands
from edge_runtime.errors import EdgeError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-runtime",
        description="Memory-budgeted LLM runtime for NVIDIA Jetson Orin.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except EdgeError as exc:
        print(f"edge-runtime {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"edge-runtime {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
