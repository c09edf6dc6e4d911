"""Imports edge_runtime for a tool run where the project may not be installed (a GPU machine that
was given the working tree only), without putting the checkout root on sys.path: that would make
kernels/ and quant/ importable as top-level packages (edge_runtime/import_path.py), which
edge_runtime refuses. The package is loaded from its folder, with the checkout root as a second
place for its subpackages, so edge_runtime.kernels and edge_runtime.quant are kernels/ and quant/
as pyproject.toml installs them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def import_edge_runtime():
    """The installed edge_runtime when there is one, else the checkout's."""
    if importlib.util.find_spec("edge_runtime") is not None:
        import edge_runtime
        return edge_runtime
    spec = importlib.util.spec_from_file_location(
        "edge_runtime", ROOT / "edge_runtime/__init__.py",
        submodule_search_locations=[str(ROOT / "edge_runtime"), str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["edge_runtime"] = module
    spec.loader.exec_module(module)
    return module
