"""The tensor table of a GGUF file and its tensors' raw bytes, without parsing the metadata values.

Why not gguf.GGUFReader for this: it turns every metadata value into numpy objects, ~490,000 of
them for SmolLM2's 49,152-token vocabulary and merges, 5-15 s per start on the 2-core machine,
while the weights need only the tensor table. This reader skips the values (their lengths are
checked against the file size, as gguf_convert.gguf_architecture does) and maps the data section
once. Types and block sizes come from the gguf package (GGML_QUANT_SIZES); tests check the table
and the bytes against GGUFReader's.

`GGUFTensors(path)[name]` is uint8 [rows, bytes per row] for quantized types (as GGUFReader's
`data`) and the element type (float32, float16; bfloat16 as uint16) for float ones, [rows, cols]
or [n] in the file's row-major order (ggml's shape reversed).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_runtime.errors import ModelLoadError

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str  # GGMLQuantizationType name: Q4_1, F32, ...
    shape: tuple[int, ...]  # row-major: (rows, cols) for a matrix
    offset: int  # from the start of the data section
    nbytes: int


class _Cursor:
    def __init__(self, f, size: int) -> None:
        self.f, self.size = f, size

    def fits(self, n: int) -> int:
        if n > self.size - self.f.tell():
            raise ValueError(f"a length of {n} bytes at offset {self.f.tell()} runs past the end")
        return n

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self.f.read(self.fits(struct.calcsize(fmt))))

    def string(self) -> str:
        return self.f.read(self.fits(self.unpack("<Q")[0])).decode()

    def skip_value(self, vtype: int) -> None:
        if vtype == _STRING:
            self.f.seek(self.fits(self.unpack("<Q")[0]), 1)
        elif vtype == _ARRAY:
            item_type, count = self.unpack("<IQ")
            if item_type in _SCALAR_SIZES:
                self.f.seek(self.fits(_SCALAR_SIZES[item_type] * count), 1)
            else:
                self.fits(8 * count)
                for _ in range(count):
                    self.skip_value(item_type)
        else:
            self.f.seek(self.fits(_SCALAR_SIZES[vtype]), 1)


def _tensor_bytes(type_name: str, shape: tuple[int, ...]) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    numel = int(np.prod(shape))
    if shape[-1] % block:
        raise ValueError(f"a row of {shape[-1]} is not a whole number of {type_name} blocks")
    return numel // block * size


def read_table(path: Path) -> tuple[dict[str, TensorInfo], int]:
    """(tensor infos by name, the data section's file offset)."""
    import gguf

    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            cur = _Cursor(f, size)
            if f.read(4) != b"GGUF":
                raise ModelLoadError(f"{path} is not a GGUF file (bad magic number)")
            _version, num_tensors, num_kv = cur.unpack("<IQQ")
            cur.fits(12 * num_kv + 24 * num_tensors)
            alignment = 32
            for _ in range(num_kv):
                key, vtype = cur.string(), cur.unpack("<I")[0]
                if key == "general.alignment" and vtype == _UINT32:
                    alignment = cur.unpack("<I")[0]
                else:
                    cur.skip_value(vtype)
            infos = {}
            for _ in range(num_tensors):
                name = cur.string()
                dims = cur.unpack(f"<{cur.unpack('<I')[0]}Q")
                type_name = gguf.GGMLQuantizationType(cur.unpack("<I")[0]).name
                offset = cur.unpack("<Q")[0]
                shape = tuple(int(d) for d in reversed(dims))
                infos[name] = TensorInfo(name, type_name, shape, offset, _tensor_bytes(type_name, shape))
            start = -(-f.tell() // alignment) * alignment
    except (struct.error, KeyError, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(f"{path} is not a valid GGUF file ({exc}); re-download it") from exc
    for info in infos.values():
        if start + info.offset + info.nbytes > size:
            raise ModelLoadError(f"{path} is truncated: tensor {info.name} runs past the end of the "
                                 "file; re-download it")
    return infos, start


class GGUFTensors:
    """The file's tensors by name, mapped read-only (drop the object to unmap)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.infos, self._start = read_table(path)
        self._map = np.memmap(path, dtype=np.uint8, mode="r")

    def __contains__(self, name: str) -> bool:
        return name in self.infos

    def info(self, name: str) -> TensorInfo:
        if name not in self.infos:
            raise ModelLoadError(f"{self.path} has no tensor {name}; is it a complete model?")
        return self.infos[name]

    def __getitem__(self, name: str) -> np.ndarray:
        info = self.info(name)
        raw = self._map[self._start + info.offset: self._start + info.offset + info.nbytes]
        if info.type_name in _FLOAT_DTYPES:
            return raw.view(_FLOAT_DTYPES[info.type_name]).reshape(info.shape)
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        return raw.reshape(rows, -1)
