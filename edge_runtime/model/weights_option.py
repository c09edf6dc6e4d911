"""`--weights`: how a GGUF model's weights are served (no torch import: the CLI parsers use it).

- gguf: from the file's own quantized blocks (model/gguf_int4.py; CPU back end, fp32 activations),
- fp32: its float32 conversion (model/gguf_convert.py), the reference,
- auto: gguf where the CPU kernels build and the model runs on the CPU back end in fp32, else
  the float conversion (on the CUDA back end in its weight dtype: engine/placement.model_weights).
"""
from __future__ import annotations

WEIGHTS = ("auto", "gguf", "fp32")


HELP = ("a GGUF model's weights: gguf = served from the file's own 4-bit blocks (CPU back end "
        "only), fp32 = its float conversion (float32 on the CPU back end, the back end's weight "
        "dtype on CUDA), auto = gguf on the CPU back end where its kernels build, the float "
        "conversion on the CUDA back end (default)")


def add_weights_option(parser, help: str = HELP) -> None:
    parser.add_argument("--weights", choices=WEIGHTS, default="auto", help=help)
