"""`edge-runtime quantize`: AWQ int4 quantization of a float model into an AutoAWQ GEMM folder.

The output folder loads like any other model (`edge-runtime generate --model DIR`, `eval-ppl`).
Calibration is a local text file (--calib) or, by default, standard-library docstrings.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "quantize", help="quantize a model to INT4 AWQ (AutoAWQ GEMM format)",
        description="Quantize a float model to 4-bit AWQ and write safetensors + config.json + "
                    "tokenizer files that `--model DIR` loads.")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="HF folder, .gguf file or built-in name (default: %(default)s)")
    p.add_argument("--out", required=True, help="output folder (must not exist or be empty)")
    p.add_argument("--group-size", type=int, default=64, choices=(64, 128),
                   help="input channels per scale/zero group (default: %(default)s)")
    p.add_argument("--calib", default=None,
                   help="UTF-8 text file for calibration (default: Python stdlib docstrings)")
    p.add_argument("--samples", type=int, default=16, help="calibration blocks (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per block (default: %(default)s)")
    p.add_argument("--no-clip", action="store_true", help="skip the clipping-range search")
    p.add_argument("--rtn", action="store_true",
                   help="round-to-nearest only (no AWQ scaling, no clipping): the baseline")
    p.set_defaults(func=run)


def _check_out_dir(out: Path) -> None:
    from edge_runtime.errors import InputError

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"output folder {out} exists and is not empty; choose a new --out folder")


def _calibration(args, tokenizer):
    from edge_runtime.errors import ConfigError
    from edge_runtime.quant import calibration

    if args.samples < 1 or args.seq_len < 16:
        raise ConfigError("--samples must be >= 1 and --seq-len >= 16")
    if args.calib:
        texts = calibration.read_text_file(args.calib)
    else:
        print("edge-runtime quantize: reading stdlib docstrings for calibration...", file=sys.stderr)
        texts = calibration.stdlib_docstrings()
    return calibration.calibration_ids(tokenizer, texts, args.samples, args.seq_len)


def run(args) -> int:
    import torch
    from tqdm import tqdm

    from edge_runtime.errors import ConfigError
    from edge_runtime.model.loader import load_model
    from edge_runtime.quant import awq_algo, awq_blocks, awq_model

    out = Path(args.out)
    _check_out_dir(out)
    start = time.perf_counter()
    lm = load_model(args.model)
    if lm.quantization != "none":
        raise ConfigError(f"{args.model} is already quantized ({lm.quantization}); give a float model")
    try:
        arch = awq_blocks.LayerArch.from_config(lm.config)
        awq_algo.check_group_size(lm.model.model.layers, args.group_size)
    except (ValueError, NotImplementedError) as exc:
        raise ConfigError(str(exc)) from exc
    calib_ids = _calibration(args, lm.tokenizer)  # [S, L]
    settings = awq_algo.AWQSettings(group_size=args.group_size, clip=not (args.no_clip or args.rtn),
                                    scale=not args.rtn)
    bar = tqdm(total=lm.config.num_layers, desc="AWQ layers", unit="layer", file=sys.stderr)
    with torch.no_grad():
        tensors = awq_algo.awq_quantize(lm.model, arch, calib_ids, settings,
                                        on_layer=lambda done, total: bar.update(1))
    bar.close()
    weights = awq_model.save_awq_checkpoint(out, lm.model, tensors, lm.path, args.group_size,
                                            lm.config.tie_word_embeddings)
    elapsed = time.perf_counter() - start
    size_mb = weights.stat().st_size / 2**20
    print(f"wrote {out} ({len(tensors)} int4 linears, group size {args.group_size}, "
          f"{'RTN' if args.rtn else 'AWQ'}{'' if settings.clip else ' without clipping'}, "
          f"calibration {calib_ids.shape[0]}x{calib_ids.shape[1]} tokens, "
          f"model.safetensors {size_mb:.1f} MiB) in {elapsed:.0f} s")
    return 0
