"""Convert a GGUF file ONCE into a Hugging Face folder in the user's cache, so later starts are fast.

Reading a GGUF goes through transformers + gguf (dequantizing every tensor to float32, ~20 s for
SmolLM2-135M); the converted folder (config.json, model.safetensors in float32, tokenizer files and
chat template) then loads in well under a second.

Invariants:
- The cache folder is `$XDG_CACHE_HOME/edge-runtime/models/<stem>-<key>` (default `~/.cache`), where
  `<stem>` is the resolved file's (a link shares its target's folder) and `<key>` hashes the GGUF's resolved path, size, mtime and CONVERT_VERSION: a changed file or a new
  converter gets a new folder.
- A folder exists only when complete: everything is written into a temporary sibling and renamed
  into place (atomic on one file system). A concurrent converter that loses the race discards its copy.
- Each folder records its source in `source.json` (resolved path, size, mtime, converter version),
  written before the rename. After a conversion completes, stale siblings are removed: those made
  from the same source path (an older file or converter: a reinstalled model package) and those
  whose recorded source no longer exists (a deleted clone) or no longer matches its size and mtime.
  Without this every reinstall added a ~500 MB folder. Never removed there: `.tmp-*` folders,
  folders whose source still exists and matches, and folders with no recorded source.
- Temporary folders are named `.tmp-<pid>-<random>`. Before converting, those whose pid is no longer
  alive (a conversion killed by SIGTERM/SIGKILL, ~500 MB each) are removed; live ones (another process
  converting right now) and names without a pid are left alone. Folders from before `source.json` are judged by the `edge_runtime_source`
  path in their config.json (same path or missing file: stale).
"""

from __future__ import annotations

import hashlib
import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from edge_runtime.errors import ModelLoadError
from edge_runtime.model.config import GGUF_REFUSED, REFUSED_ARCHITECTURES
from edge_runtime.paths import cache_dir

CONVERT_VERSION = 1


def cache_root() -> Path:
    return cache_dir("models")


def source_record(gguf_path: Path) -> dict:
    st = gguf_path.stat()
    return {"path": str(gguf_path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "version": CONVERT_VERSION}


def metadata_root() -> Path:
    """Folders with a GGUF's config and tokenizer only (the weights are read from the GGUF itself,
    model/gguf_int4.py); a root of their own, so neither kind's clean-up removes the other."""
    return cache_dir("gguf-metadata")


def cached_folder_for(gguf_path: Path, weights: bool = True) -> Path:
    src = source_record(gguf_path)
    ident = f"{src['path']}|{src['size']}|{src['mtime_ns']}|v{CONVERT_VERSION}"
    key = hashlib.sha256(ident.encode()).hexdigest()[:12]
    # Named by the resolved file, as it is keyed: a link and its target share one folder (named by
    # the link, the two folders would have the same source and each conversion would remove the
    # other as stale).
    stem = Path(src["path"]).stem
    return (cache_root() if weights else metadata_root()) / f"{stem}-{key}"


def ensure_converted(gguf_path: Path, progress: Callable[[str], None] | None = None,
                     weights: bool = True) -> Path:
    """Return the cached HF folder for `gguf_path`, converting it first if needed. weights=False:
    config, tokenizer and generation config only (no float32 weights; a few seconds less, ~500 MB
    less disk)."""
    target = cached_folder_for(gguf_path, weights)
    if (target / "config.json").is_file():
        return target
    check_supported(gguf_path)  # a text file renamed .gguf is refused before "converting ..."
    if progress:
        what = "to float32" if weights else "config and tokenizer"
        progress(f"converting {gguf_path.name} ({what}) to {target} (once; about 20-30 s)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_temp_folders(target.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=target.parent))
    except OSError as exc:
        raise ModelLoadError(
            f"cannot write the model cache {target.parent} ({exc.strerror}): "
            "set XDG_CACHE_HOME to a writable folder"
        ) from exc
    try:
        (_convert if weights else _convert_metadata)(gguf_path, tmp)
        with _writing(tmp):
            (tmp / SOURCE_FILE).write_text(json.dumps(source_record(gguf_path)))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    remove_stale_siblings(target, source_record(gguf_path))
    return target


SOURCE_FILE = "source.json"


@contextlib.contextmanager
def _writing(tmp: Path) -> Iterator[None]:
    """Turn a failed write into the temp folder (a full disk: OSError, or safetensors' own
    SafetensorError "No space left on device (os error 28)") into a ModelLoadError; the caller
    removes the partial folder."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, SafetensorError) as exc:
        folder = tmp.parent
        if getattr(exc, "errno", None) == errno.ENOSPC or "os error 28" in str(exc):
            raise ModelLoadError(f"no space left on device writing the converted model to {folder}; "
                                 "free space or set XDG_CACHE_HOME to a larger disk") from exc
        raise ModelLoadError(f"cannot write the converted model to {folder}: "
                             f"{' '.join(str(exc).split())}; set XDG_CACHE_HOME to a writable "
                             "folder") from exc
_TMP_NAME = re.compile(r"\.tmp-(\d+)-.+")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists but is not ours (EPERM), or cannot tell: keep its folder
    return True


def remove_dead_temp_folders(root: Path) -> list[Path]:
    """Delete `.tmp-<pid>-*` folders whose converting process is gone; see module doc."""
    removed = []
    for folder in sorted(root.iterdir()):
        match = _TMP_NAME.fullmatch(folder.name)
        if match is None or int(match.group(1)) <= 0 or not folder.is_dir():
            continue
        if _pid_alive(int(match.group(1))):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _recorded_source(folder: Path) -> dict | None:
    """What `folder` was converted from, or None when unknown (then it is never removed)."""
    try:
        if (folder / SOURCE_FILE).is_file():
            record = json.loads((folder / SOURCE_FILE).read_text())
        else:  # converted before source.json existed: only the path is known
            record = {"path": json.loads((folder / "config.json").read_text())["edge_runtime_source"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("path"), str) else None


def _is_stale(record: dict, current: dict) -> bool:
    if record["path"] == current["path"]:
        return True  # same source, other key: an older file or converter version
    try:
        st = os.stat(record["path"])
    except OSError:
        return True  # the source is gone (a deleted clone or package)
    if "size" not in record:
        return False  # legacy folder whose source still exists: keep
    return (st.st_size, st.st_mtime_ns) != (record["size"], record.get("mtime_ns"))


def remove_stale_siblings(target: Path, current: dict) -> list[Path]:
    """Delete completed cache folders next to `target` that can never be used again; see module doc."""
    removed = []
    for folder in sorted(target.parent.iterdir()):
        if folder == target or folder.name.startswith(".") or not folder.is_dir():
            continue
        record = _recorded_source(folder)
        if record is None or not _is_stale(record, current):
            continue
        # Rename first so no reader sees a half-deleted folder that still has config.json.
        doomed = folder.with_name(f".stale-{folder.name}")
        try:
            os.rename(folder, doomed)
        except OSError:
            continue  # another process removed or is removing it
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(folder)
    return removed


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
GGUF_ARCHITECTURES = ("llama", "qwen2", "mistral", "qwen3", "gemma3")


def check_supported(gguf_path: Path) -> None:
    """The file is a GGUF of a supported architecture (header only: before any conversion work)."""
    arch = gguf_architecture(gguf_path)
    if arch not in GGUF_ARCHITECTURES:
        why = f" ({REFUSED_ARCHITECTURES[GGUF_REFUSED[arch]]})" if arch in GGUF_REFUSED else ""
        raise ModelLoadError(
            f"GGUF architecture {arch!r} is not supported{why}; supported: "
            + ", ".join(GGUF_ARCHITECTURES)
        )


def gguf_architecture(path: Path) -> str:
    """`general.architecture` from the GGUF header, read without parsing the tensors (fast).

    Every length read from the file is checked against the file size before it is used, so random
    bytes after the magic are a ModelLoadError, not a many-GB allocation."""
    import struct

    size = path.stat().st_size

    def fits(f, n: int) -> int:
        if n > size - f.tell():
            raise ValueError(f"a length of {n} bytes at offset {f.tell()} runs past the end of the file")
        return n

    def read(f, n: int) -> bytes:
        return f.read(fits(f, n))

    def unpack(f, fmt: str) -> tuple:
        return struct.unpack(fmt, read(f, struct.calcsize(fmt)))

    def skip(f, vtype: int) -> None:
        if vtype == _STRING:
            f.seek(fits(f, unpack(f, "<Q")[0]), 1)
        elif vtype == _ARRAY:
            item_type, count = unpack(f, "<IQ")
            if item_type in _SCALAR_SIZES:
                f.seek(fits(f, _SCALAR_SIZES[item_type] * count), 1)
            else:
                fits(f, 8 * count)  # every string or array item is at least 8 bytes
                for _ in range(count):
                    skip(f, item_type)
        else:
            f.seek(fits(f, _SCALAR_SIZES[vtype]), 1)

    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelLoadError(f"{path} is not a GGUF file (bad magic number)")
            _version, _tensors, num_kv = unpack(f, "<IQQ")
            fits(f, 12 * num_kv)  # each key/value is at least 12 bytes
            for _ in range(num_kv):
                key = read(f, unpack(f, "<Q")[0]).decode()
                vtype = unpack(f, "<I")[0]
                if key == "general.architecture" and vtype == _STRING:
                    return read(f, unpack(f, "<Q")[0]).decode()
                skip(f, vtype)
    except (struct.error, KeyError, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(f"{path} is not a valid GGUF file ({exc}); re-download it") from exc
    raise ModelLoadError(f"{path} has no general.architecture field")


def _convert(gguf_path: Path, out: Path) -> None:
    import struct

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_supported(gguf_path)
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, OSError, KeyError, RuntimeError, IndexError, EOFError,
            struct.error) as exc:  # what transformers/gguf raise on a truncated or corrupt file
        raise ModelLoadError(f"cannot read GGUF file {gguf_path} (truncated or corrupt? "
                             f"re-download it): {exc}") from exc
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)  # the weights are dequantized: a plain float32 folder
    cfg.pop("_model_name_or_path", None)
    cfg["architectures"] = [type(model).__name__]
    cfg["dtype"] = "float32"
    cfg["edge_runtime_source"] = str(gguf_path.resolve())
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    with _writing(out):
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(str(out))
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(str(out))


def _read_gguf_metadata(gguf_path: Path):
    """(transformers config, tokenizer) of a GGUF, without its tensors."""
    import struct

    from transformers import AutoConfig, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        return (AutoConfig.from_pretrained(folder, gguf_file=name),
                AutoTokenizer.from_pretrained(folder, gguf_file=name))
    except (ValueError, OSError, KeyError, RuntimeError, IndexError, EOFError,
            struct.error) as exc:
        raise ModelLoadError(f"cannot read GGUF file {gguf_path} (truncated or corrupt? "
                             f"re-download it): {exc}") from exc


def _convert_metadata(gguf_path: Path, out: Path) -> None:
    """config.json (as _convert writes it, no dtype), tokenizer files, generation_config.json."""
    from transformers import GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    check_supported(gguf_path)
    config, tokenizer = _read_gguf_metadata(gguf_path)
    cfg = config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "dtype"):
        cfg.pop(key, None)
    cfg["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    cfg["edge_runtime_source"] = str(gguf_path.resolve())
    with _writing(out):
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
        tokenizer.save_pretrained(str(out))
        GenerationConfig.from_model_config(config).save_pretrained(str(out))
