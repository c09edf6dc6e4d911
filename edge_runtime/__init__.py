"""edge-runtime: a memory-budgeted LLM inference runtime for NVIDIA Jetson Orin.

`kernels/` and `quant/` at the repository root are installed as `edge_runtime.kernels` and
`edge_runtime.quant` (see pyproject.toml); the checkout root itself must never be on sys.path
(edge_runtime/import_path.py), which importing this package checks.
"""

from edge_runtime.import_path import refuse_checkout_on_path

refuse_checkout_on_path()

__version__ = "0.1.0"
