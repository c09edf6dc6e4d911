"""The checkout root is never on sys.path.

The repository's top-level `kernels/` and `quant/` folders are installed as `edge_runtime.kernels`
and `edge_runtime.quant`. Were the checkout root on sys.path, they would also be importable as the
top-level packages `kernels` and `quant`, and `kernels` is the name of Hugging Face's kernel
package, which transformers (>= 5.25) imports when a model module loads: our folder would shadow
it, or stand in for it where it is not installed, and every model load would fail far from the
cause. `python -m X` and `python -c ...` put the working directory first on sys.path, so whether
that happened would depend on where a command was started.

Invariants:
- importing edge_runtime with the checkout root on sys.path (as '' or as a path) raises
  ImportError that says how to start Python instead (`refuse_checkout_on_path`);
- every Python child edge-runtime, its tests and tools start is started by `module_argv` or
  `code_argv`, which never put the working directory on the child's sys.path (on every supported
  Python: `-P` from 3.11, a one-line prelude on 3.10, where `-P` does not exist).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The checkout root when edge_runtime is imported from a checkout (editable install); for an
# installed wheel this folder has no kernels/ beside edge_runtime/ and nothing is refused.
CHECKOUT_ROOT = Path(__file__).resolve().parent.parent
SHADOWING_FOLDERS = ("kernels", "quant")

# Python 3.10 has no -P: the child drops sys.path[0] (the working directory for -c) itself, then
# runs the module as `python -m` would.
_PRELUDE_310 = "import sys; del sys.path[0]; "
_RUN_MODULE_310 = (_PRELUDE_310 + "import runpy; m = sys.argv.pop(1); "
                   "runpy.run_module(m, run_name='__main__', alter_sys=True)")


def _is_checkout(root: Path) -> bool:
    return all((root / name / "__init__.py").is_file() for name in SHADOWING_FOLDERS)


def _resolved(entry: str) -> Path | None:
    try:
        return Path(entry or os.getcwd()).resolve()
    except (OSError, RuntimeError):
        return None


def checkout_entries(path: list[str], root: Path = CHECKOUT_ROOT) -> list[str]:
    """The entries of `path` (a sys.path) that name the checkout root; none outside a checkout."""
    if not _is_checkout(root):
        return []
    return [entry for entry in path if _resolved(entry) == root]


def refuse_checkout_on_path(path: list[str] | None = None, root: Path = CHECKOUT_ROOT) -> None:
    entries = checkout_entries(sys.path if path is None else path, root)
    if not entries:
        return
    shown = ", ".join(repr(e) + (" (the working directory)" if e == "" else "") for e in entries)
    raise ImportError(
        f"edge-runtime: the checkout root {root} is on sys.path as {shown}, so its kernels/ and "
        f"quant/ folders would be importable as the top-level packages 'kernels' (the name of "
        f"Hugging Face's kernel package that transformers imports) and 'quant'. `python -m ...` "
        f"and `python -c ...` started in the checkout put it there. Start the `edge-runtime` or "
        f"`pytest` command in .venv/bin instead, or `python -P -m ...` (Python 3.11+), or run "
        f"Python from another folder; remove the checkout from PYTHONPATH if it is there.")


def module_argv(module: str, *args: str, python: str | None = None,
                version: tuple[int, int] | None = None) -> list[str]:
    """argv that runs `python -m module args...` without the working directory on sys.path."""
    python = python or sys.executable
    if (version or sys.version_info[:2]) >= (3, 11):
        return [python, "-P", "-m", module, *args]
    return [python, "-c", _RUN_MODULE_310, module, *args]


def code_argv(code: str, *args: str, python: str | None = None,
              version: tuple[int, int] | None = None) -> list[str]:
    """argv that runs `python -c code args...` without the working directory on sys.path."""
    python = python or sys.executable
    if (version or sys.version_info[:2]) >= (3, 11):
        return [python, "-P", "-c", code, *args]
    return [python, "-c", _PRELUDE_310 + "\n" + code, *args]
