"""`--weights`: how a GGUF model's weights are served (no torch import: the CLI parsers use it).

- gguf: from the file's own quantized blocks (model/gguf_int4.py; CPU back end, fp32 activations),
- fp32: its float32 conversion (model/gguf_convert.py), the reference,
- auto: gguf where the CPU kernels build and the model runs on the CPU in fp32, else fp32.
"""
from __future__ import annotations

WEIGHTS = ("auto", "gguf", "fp32")


def add_weights_option(parser) -> None:
    parser.add_argument("--weights", choices=WEIGHTS, default="auto",
                        help="a GGUF model's weights: gguf = served from the file's own 4-bit "
                             "blocks (CPU back end), fp32 = its float32 conversion (the reference), "
                             "auto = gguf where the CPU kernels build (default)")
