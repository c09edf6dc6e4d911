"""`edge-runtime quantize`: AWQ int4 quantization of a float model into an AutoAWQ GEMM folder.

The output folder loads like any other model (`edge-runtime generate --model DIR`, `eval-ppl`).
Calibration is a local text file (--calib) or, by default, standard-library docstrings.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from edge_runtime.engine.placement import pick_device
from edge_runtime.errors import ConfigError, InputError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "quantize", help="quantize a model to INT4 AWQ (AutoAWQ GEMM format)",
        description="Quantize a float model to 4-bit AWQ and write safetensors + config.json + "
                    "tokenizer files that `--model DIR` loads.")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="HF folder, .gguf file or built-in name (default: %(default)s)")
    p.add_argument("--out", required=True, help="output folder: must not exist or be empty; its parent folder must exist")
    p.add_argument("--group-size", type=int, default=64, choices=(64, 128),
                   help="input channels per scale/zero group (default: %(default)s)")
    p.add_argument("--calib", default=None,
                   help="UTF-8 text file for calibration (default: Python stdlib docstrings)")
    p.add_argument("--samples", type=int, default=16, help="calibration blocks, >= 1 (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per block, 16 to the model's context (default: %(default)s)")
    p.add_argument("--no-clip", action="store_true", help="skip the clipping-range search")
    p.add_argument("--rtn", action="store_true",
                   help="round-to-nearest only (no AWQ scaling, no clipping): the baseline")
    p.add_argument("--device", default="auto",
                   help="where calibration runs (fp32, plain torch layers, no engine back end): "
                        "auto (cuda when torch sees a CUDA device, else cpu), cpu, cuda or cuda:N")
    p.set_defaults(func=run)


def _check_out_dir(out: Path) -> None:
    """--out can be created (or is an empty folder) before anything is loaded."""
    import os
    import tempfile

    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file; give a folder name (it must not exist or be empty)")
    if out.is_dir() and any(out.iterdir()):
        raise InputError(f"output folder {out} exists and is not empty; choose a new --out folder "
                         "or delete it")
    parent = out.parent
    if parent.exists() and not parent.is_dir():
        raise InputError(f"--out {out}: {parent} is a file, not a folder; choose another path")
    if not parent.is_dir():
        raise InputError(f"--out {out}: the folder {parent} does not exist; create it or choose "
                         "another path")
    try:  # the checkpoint is written as a sibling and renamed: probe exactly that
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=parent))
    except OSError as exc:
        raise InputError(f"--out {out}: cannot create a folder in {parent} ({exc.strerror}); "
                         "choose a writable path") from exc


def _check_numbers(args) -> None:
    if args.samples < 1:
        raise ConfigError(f"--samples must be >= 1, got {args.samples}")
    if args.seq_len < 16:
        raise ConfigError(f"--seq-len must be >= 16, got {args.seq_len}")


def _read_calibration(args) -> list[str]:
    from edge_runtime.quant import calibration  # start-up time: imports torch

    if args.calib:
        return calibration.read_text_file(args.calib)
    print("edge-runtime quantize: reading stdlib docstrings for calibration...", file=sys.stderr)
    return calibration.stdlib_docstrings()


def _check_context(args, config) -> None:
    if args.seq_len > config.max_position_embeddings:
        raise ConfigError(f"--seq-len {args.seq_len} is longer than the model's context "
                          f"({config.max_position_embeddings} tokens); give at most that")


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM: unwind like Ctrl-C, so the partial output is removed


def run(args) -> int:
    import signal
    import threading

    out = Path(args.out)
    _check_out_dir(out)
    _check_numbers(args)
    texts = _read_calibration(args) if args.calib else None  # a bad file fails before the load
    if threading.current_thread() is not threading.main_thread():
        return _quantize(args, out, texts)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return _quantize(args, out, texts)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _quantize(args, out: Path, texts: list[str] | None) -> int:
    import torch
    from tqdm import tqdm

    from edge_runtime.model.loader import load_model  # start-up time: imports numpy, torch
    from edge_runtime.model import awq_model  # start-up time: imports numpy, torch
    from edge_runtime.quant import awq_algo, awq_blocks, calibration  # start-up time: imports torch

    start = time.perf_counter()
    device = pick_device(args.device)
    lm = load_model(args.model, device=device, weights="fp32")  # a GGUF: its float conversion
    if lm.quantization != "none":
        raise ConfigError(f"{args.model} is already quantized ({lm.quantization}); give a float model")
    _check_context(args, lm.config)
    try:
        arch = awq_blocks.LayerArch.from_config(lm.config)
        awq_algo.check_group_size(lm.model.model.layers, args.group_size)
    except (ValueError, NotImplementedError) as exc:
        raise ConfigError(str(exc)) from exc
    texts = texts or _read_calibration(args)
    calib_ids = calibration.calibration_ids(lm.tokenizer, texts, args.samples, args.seq_len)  # [S, L]
    settings = awq_algo.AWQSettings(group_size=args.group_size, clip=not (args.no_clip or args.rtn),
                                    scale=not args.rtn)
    bar = tqdm(total=lm.config.num_layers, desc="AWQ layers", unit="layer", file=sys.stderr)
    with torch.no_grad():
        tensors = awq_algo.awq_quantize(lm.model, arch, calib_ids.to(device), settings,
                                        on_layer=lambda done, total: bar.update(1))
    bar.close()
    if device != "cpu":  # the checkpoint is written from CPU tensors
        lm.model.cpu()
        tensors = {k: tuple(None if t is None else t.cpu() for t in v) for k, v in tensors.items()}
    weights = awq_model.save_awq_checkpoint(out, lm.model, tensors, lm.path, args.group_size,
                                            lm.config.tie_word_embeddings)
    elapsed = time.perf_counter() - start
    size_mb = weights.stat().st_size / 2**20
    print(f"wrote {out} ({len(tensors)} int4 linears, group size {args.group_size}, "
          f"{'RTN' if args.rtn else 'AWQ'}{'' if settings.clip else ' without clipping'}, "
          f"calibration {calib_ids.shape[0]}x{calib_ids.shape[1]} tokens, "
          f"model.safetensors {size_mb:.1f} MiB) in {elapsed:.0f} s")
    return 0
