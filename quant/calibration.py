"""Calibration text for AWQ: a user's text file, or by default docstrings of Python's standard
library, read offline with `ast` from the installed stdlib sources (no module is imported).

Never the evaluation text (the Debian license texts). Token blocks are built like AutoAWQ's
`get_calib_dataset`: documents are tokenized, concatenated (no BOS) and cut into blocks of
`seq_len`; we take `num_samples` blocks.

Invariant: the default corpus is deterministic for a given Python version (sorted files, fixed
seed for the document order).
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path

import torch

from edge_runtime.errors import InputError

_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "__pycache__",
              "turtledemo", "ensurepip", "pydoc_data"}


def _docstrings_of(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return []
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    docs = (ast.get_docstring(n) for n in nodes)
    return [d for d in docs if d and len(d) >= 200]


def stdlib_docstrings(seed: int = 0) -> list[str]:
    """Docstrings (>= 200 characters) of the standard library's .py files, shuffled with `seed`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if not _SKIP_DIRS.intersection(p.relative_to(root).parts))
    docs = [d for f in files for d in _docstrings_of(f)]
    random.Random(seed).shuffle(docs)
    return docs


def read_text_file(path: str) -> list[str]:
    """Paragraphs (blank-line separated) of a UTF-8 text file."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"calibration file {path} is a folder; pass a UTF-8 text file")
    if not p.exists():
        raise InputError(f"calibration file {path} does not exist; pass a UTF-8 text file")
    if not p.is_file():  # /dev/null, a FIFO: reading one may block or give nothing
        raise InputError(f"calibration file {path} is not a regular file; pass a UTF-8 text file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"calibration file {path} is not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:  # no read permission, I/O error
        raise InputError(f"calibration file {path} cannot be read ({exc.strerror}); pass a "
                         "readable UTF-8 text file") from exc
    paragraphs = [t.strip() for t in text.split("\n\n") if t.strip()]
    if not paragraphs:
        raise InputError(f"calibration file {path} is empty")
    return paragraphs


def calibration_ids(tokenizer, texts: list[str], num_samples: int, seq_len: int) -> torch.Tensor:
    """Concatenate tokenized `texts` and cut them into num_samples blocks: long [S, L]."""
    need = num_samples * seq_len
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer.encode(text.strip() + "\n\n", add_special_tokens=False))
        if len(ids) >= need:
            break
    if len(ids) < need:
        raise InputError(
            f"calibration text has {len(ids)} tokens, fewer than samples x seq-len = {need}; "
            "give a longer file or lower --samples / --seq-len")
    return torch.tensor(ids[:need], dtype=torch.long).view(num_samples, seq_len)
