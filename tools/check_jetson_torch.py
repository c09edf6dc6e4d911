"""Is the torch this interpreter sees one edge-runtime can run on a Jetson? (tools/bootstrap.sh and
tools/install-service.sh run it with JetPack's python3 before creating a venv over its site
packages.) Prints what to install and exits 2 when not; prints the torch version and exits 0.

What counts: Python >= 3.10 (the project's floor; JetPack 6 ships 3.10), a torch built with CUDA
(NVIDIA's JetPack wheel, not a CPU-only one from the package index), and torch >= TORCH_MIN, the
oldest torch transformers 5.x accepts (transformers/utils/import_utils.py, is_torch_available:
below 2.6 it disables PyTorch and no model loads). Runs on Python 3.10 with nothing but torch.
"""
from __future__ import annotations

import re
import sys

TORCH_MIN = (2, 6)
# what to do when NVIDIA's torch is missing or too old (JetPack 6: CUDA 12.6, Python 3.10)
INSTALL_HINT = ("install NVIDIA's torch >= {min} for JetPack 6 (CUDA 12.6, Python 3.10) into "
                "JetPack's python3, e.g. `python3 -m pip install torch` from the Jetson AI Lab "
                "index for jp6/cu126 (see NVIDIA's 'Installing PyTorch for Jetson Platform'), "
                "then run this again")


def version_tuple(text: str) -> tuple[int, int]:
    """'2.5.0a0+872d972e41.nv24.08' -> (2, 5)."""
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"cannot read the torch version {text!r}")
    return int(match.group(1)), int(match.group(2))


def problem() -> str | None:
    """What is wrong with this interpreter's torch for a Jetson install, or None."""
    hint = INSTALL_HINT.format(min=".".join(map(str, TORCH_MIN)))
    if sys.version_info < (3, 10):
        return (f"{sys.executable} is Python {sys.version.split()[0]}; edge-runtime needs >= 3.10 "
                "(JetPack 6; JetPack 5's Python 3.8 is not supported)")
    try:
        import torch
    except ImportError:
        return f"no torch for {sys.executable}: {hint}"
    if getattr(torch.version, "cuda", None) is None:
        return (f"torch {torch.__version__} for {sys.executable} is a CPU-only build (a wheel from "
                f"the package index, not NVIDIA's): {hint}")
    if version_tuple(torch.__version__) < TORCH_MIN:
        return (f"torch {torch.__version__} is older than transformers 5.x accepts "
                f"(>= {'.'.join(map(str, TORCH_MIN))}): {hint}")
    return None


def main() -> int:
    why = problem()
    if why is not None:
        print(f"edge-runtime: {why}", file=sys.stderr)
        return 2
    import torch

    print(f"torch {torch.__version__} (CUDA {torch.version.cuda})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
