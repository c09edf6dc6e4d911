"""AWQ quantization (AutoAWQ GEMM format); installed as edge_runtime.quant."""
