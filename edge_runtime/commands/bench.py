"""`edge-runtime bench <sub>`: on-device benchmarks that print a markdown table and write JSON.

Subcommands are found automatically: every module in `edge_runtime/bench/` that defines
`register_subcommand(subparsers)` adds its own parser (setting `func=run(args) -> int`), so other
areas add `bench weights` / `bench service` without editing this file. Modules are imported when the
parser is built, so a bench module must keep torch/transformers imports inside its `run`.
Every subcommand's `func` is wrapped so that its output files (--json, --plot) are checked before
it runs: a bad path fails in a second, not after the whole benchmark.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil

from edge_runtime import bench
from edge_runtime.bench.checks import checked


def _discover(subparsers) -> list[str]:
    found = []
    for info in sorted(pkgutil.iter_modules(bench.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{bench.__name__}.{info.name}")
        register = getattr(module, "register_subcommand", None)
        if callable(register):
            register(subparsers)
            found.append(info.name)
    for sub in subparsers.choices.values():
        run = sub.get_default("func")
        if run is not None:
            sub.set_defaults(func=checked(run))
    return found


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmarks: engine throughput, trace replay vs transformers, ...",
        description="On-device benchmarks. Each prints a markdown table and can write JSON.",
    )
    subs = parser.add_subparsers(dest="bench_command", metavar="BENCH")
    _discover(subs)
    parser.set_defaults(func=lambda args: _no_sub(parser, args))


def _no_sub(parser: argparse.ArgumentParser, args) -> int:
    parser.print_help()
    return 2
