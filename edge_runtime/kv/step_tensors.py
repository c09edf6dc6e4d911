"""Find every tensor a step context holds, by path, and put replacements back (for the one packed
upload of engine/step_transfers.py), whatever the context's structure.

`collect(obj)` walks obj's attributes (except those named in `skip`) through dicts, lists, tuples
(named ones too) and dataclasses, and returns {path: tensor}; `replace(obj, tensors)` puts the
tensors of the same paths back: attributes and dict/list items in place, tuples and frozen
dataclasses rebuilt. A context added later (or restructured) is uploaded with no code of its own.

Invariant: `replace(obj, collect(obj))` leaves obj as it was.
"""

from __future__ import annotations

import dataclasses

import torch


def collect(obj, skip: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, value in vars(obj).items():
        if name not in skip:
            _walk(value, name, out)
    return out


def replace(obj, tensors: dict[str, torch.Tensor], skip: frozenset[str] = frozenset()) -> None:
    for name, value in vars(obj).items():
        if name not in skip:
            setattr(obj, name, _rebuild(value, name, tensors))


def _children(value):
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    return []


def _walk(value, path: str, out: dict) -> None:
    if isinstance(value, torch.Tensor):
        out[path] = value
        return
    for key, child in _children(value):
        _walk(child, f"{path}.{key}", out)


def _rebuild(value, path: str, tensors: dict):
    if isinstance(value, torch.Tensor):
        return tensors.get(path, value)
    children = _children(value)
    if not children:
        return value
    new = {key: _rebuild(child, f"{path}.{key}", tensors) for key, child in children}
    if isinstance(value, dict):
        return new
    if isinstance(value, list):
        return [new[i] for i in range(len(value))]
    if isinstance(value, tuple):
        items = [new[i] for i in range(len(value))]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return dataclasses.replace(value, **new)
