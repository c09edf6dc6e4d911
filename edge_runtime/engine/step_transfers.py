"""Every host<->device crossing of an engine step goes through here, and can be counted.

`StepTransfers.upload(parts)` moves a step's host tensors (token ids, positions, block tables,
seq idx, kv lens, slot mappings, sampler inputs) to the device as ONE packed byte buffer: each
part's bytes at an 8-byte aligned offset, one copy (pinned and non-blocking on CUDA), then a
view per part with its own dtype and shape. dtypes are kept (int64 slot mappings stay int64:
the kernels' address arithmetic follows the index dtype). `download(t)` brings a device tensor
back as a list, the one synchronization a step needs (the chosen token ids).

`SyncCounter` is a TorchFunctionMode that counts, inside `device_region()` blocks, the tensor
methods that make the host wait for the device or copy between them (`.item()`, `.tolist()`,
`int(t)`, `bool(t)`, `float(t)`, `.cpu()`, `.numpy()`, `.to(device)`, `.copy_` across devices).
On the CUDA back end under the Triton interpreter every tensor lives on the CPU, so what a
method would cost on a GPU cannot be seen from the tensor; the engine therefore marks the part
of a step that runs on the device (the forward and the sampling, between the upload and the
download) and the counter checks there. Transfers made by this module are counted separately.

Invariants:
- A pass-through instance (`pack=False`, the CPU back end) returns the host tensors themselves.
- Counting never changes a result: the mode calls every function unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

_IN_DEVICE_REGION = contextvars.ContextVar("in_device_region", default=False)
_IN_HELPER = contextvars.ContextVar("in_transfer_helper", default=False)
_ALIGN = 8
SYNC_METHODS = ("item", "tolist", "__int__", "__index__", "__bool__", "__float__", "cpu", "numpy")


@contextlib.contextmanager
def device_region():
    """Marks code that must run on the device without waiting for it (the forward, sampling)."""
    token = _IN_DEVICE_REGION.set(True)
    try:
        yield
    finally:
        _IN_DEVICE_REGION.reset(token)


@contextlib.contextmanager
def _helper():
    token = _IN_HELPER.set(True)
    try:
        yield
    finally:
        _IN_HELPER.reset(token)


class StepTransfers:
    """Counts: uploads, downloads, bytes_up, bytes_down (for the bench and the tests)."""

    def __init__(self, device: torch.device, pack: bool = True):
        self.device = torch.device(device)
        self.pack = pack
        self.counters = Counter()

    def upload(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Host tensors -> the same tensors on the device, in one copy."""
        if not self.pack or not parts:
            return parts
        with _helper():
            host, layout = self._packed(parts)
            buf = host.to(self.device, non_blocking=True)
            self._count_upload(host)
            return {name: _view(buf, start, t) for name, t, start in layout}

    def allocate(self, template: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A device buffer in `template`'s packed layout and its views (a static input buffer:
        `upload_into` refills it in place, so the views, and a graph captured on them, stay)."""
        with _helper():
            host, layout = self._packed(template)
            buf = host.to(self.device, copy=True)
            return buf, {name: _view(buf, start, t) for name, t, start in layout}

    def upload_into(self, buf: torch.Tensor, parts: dict[str, torch.Tensor]) -> None:
        """Refill a buffer from `allocate` (the same names, dtypes and shapes) in one copy."""
        with _helper():
            host, _ = self._packed(parts)
            assert host.shape == buf.shape, (host.shape, buf.shape)
            buf.copy_(host, non_blocking=True)
            self._count_upload(host)

    def _packed(self, parts: dict[str, torch.Tensor]):
        layout, offset = [], 0
        for name, t in parts.items():
            t = t.contiguous()
            layout.append((name, t, offset))
            offset += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
        host = torch.zeros(max(offset, _ALIGN), dtype=torch.uint8,
                           pin_memory=self.device.type == "cuda")
        for _, t, start in layout:
            if t.numel():
                host[start:start + t.numel() * t.element_size()] = t.view(-1).view(torch.uint8)
        return host, layout

    def _count_upload(self, host: torch.Tensor) -> None:
        self.counters["uploads"] += 1
        self.counters["bytes_up"] += host.numel()

    def download(self, t: torch.Tensor) -> list:
        """A device tensor -> its values as (nested) Python lists: one synchronization."""
        with _helper():
            self.counters["downloads"] += 1
            self.counters["bytes_down"] += t.numel() * t.element_size()
            return t.tolist()


def _view(buf: torch.Tensor, start: int, like: torch.Tensor) -> torch.Tensor:
    nbytes = like.numel() * like.element_size()
    if nbytes == 0:
        return torch.empty(like.shape, dtype=like.dtype, device=buf.device)
    return buf[start:start + nbytes].view(like.dtype).view(like.shape)


def _names_a_device(args, kwargs) -> bool:
    if "device" in (kwargs or {}):
        return True
    return any(isinstance(a, (torch.device, str)) or (isinstance(a, torch.Tensor) and a is not args[0])
               for a in args[1:])


class SyncCounter(TorchFunctionMode):
    """`with SyncCounter() as c:` ... `c.syncs` (method name -> calls inside device regions),
    `c.transfers_outside_helper` (device moves not made by StepTransfers, anywhere)."""

    def __init__(self):
        super().__init__()
        self.syncs: Counter = Counter()
        self.transfers_outside_helper = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if not _IN_HELPER.get():
            moves = name == "to" and _names_a_device(args, kwargs) or name in ("cpu", "numpy") or \
                (name == "copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor)
                 and args[1].device != args[0].device)
            self.transfers_outside_helper += int(moves)
            if _IN_DEVICE_REGION.get() and (name in SYNC_METHODS or moves):
                self.syncs[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total_syncs(self) -> int:
        return sum(self.syncs.values())
