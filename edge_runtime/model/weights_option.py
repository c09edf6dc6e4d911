"""`--weights`: how a GGUF model's weights are served (no torch import: the CLI parsers use it).

- gguf: from the file's own quantized blocks (model/gguf_int4.py): the C kernels on the CPU back
  end (fp32 activations), the blocked W4A16 Triton kernel on the CUDA back end (activations in
  the back end's weight dtype, fp16 on the Orin budgets),
- fp32: its float conversion (model/gguf_convert.py), the reference: float32 on the CPU back end,
  the back end's weight dtype on CUDA,
- auto: gguf, except on the CPU back end where the C kernels do not build (the float conversion).
"""
from __future__ import annotations

WEIGHTS = ("auto", "gguf", "fp32")


HELP = ("a GGUF model's weights: gguf = served from the file's own 4-bit blocks (C kernels on "
        "the CPU back end, Triton on CUDA), fp32 = its float conversion, the reference (float32 "
        "on the CPU back end, the back end's weight dtype on CUDA), auto = gguf unless the CPU "
        "back end's C kernels do not build (default)")


def add_weights_option(parser, help: str = HELP) -> None:
    parser.add_argument("--weights", choices=WEIGHTS, default="auto", help=help)
