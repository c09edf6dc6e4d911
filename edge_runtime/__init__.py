"""edge-runtime: a memory-budgeted LLM inference runtime for NVIDIA Jetson Orin.

`kernels/` and `quant/` at the repository root are installed as `edge_runtime.kernels` and
`edge_runtime.quant` (see pyproject.toml).
"""

__version__ = "0.1.0"
