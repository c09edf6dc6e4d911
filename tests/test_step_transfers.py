"""Host<->device traffic of an engine step (engine/step_transfers.py): the packed upload keeps every
tensor's values, dtype and shape; the counter sees what would make a GPU step wait; and a decode
step of the CUDA back end (on CPU tensors under the Triton interpreter) makes exactly its uploads
(token ids + metadata; sampler inputs when a row samples) and one download (the token ids), with
no synchronization and no other copy in the forward or the sampling, whatever the layer count."""

import pytest
import torch

from backend_helpers import engine_on
from model_helpers import random_ids

from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.step_transfers import StepTransfers, SyncCounter, device_region
from edge_runtime.kernels import dispatch


def test_packed_upload_keeps_values_dtypes_and_shapes():
    g = torch.Generator().manual_seed(0)
    parts = {"ids": torch.randint(0, 1 << 40, (7,), generator=g),  # int64 beyond int32
             "table": torch.randint(-5, 99, (3, 5), generator=g, dtype=torch.int32),
             "flags": torch.tensor([True, False, True]),
             "u": torch.rand(3, generator=g),
             "empty": torch.zeros(0, 4, dtype=torch.int64),
             "odd": torch.arange(3, dtype=torch.int16),
             "after": torch.arange(5, dtype=torch.float64)}
    t = StepTransfers("cpu", pack=True)
    got = t.upload(parts)
    assert t.counters["uploads"] == 1 and t.counters["bytes_up"] % 8 == 0
    for name, want in parts.items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        assert torch.equal(got[name], want), name
    assert StepTransfers("cpu", pack=False).upload(parts)["ids"] is parts["ids"]


def test_step_tensors_finds_and_replaces_tensors_in_any_structure():
    import collections
    import dataclasses

    from edge_runtime.kv import step_tensors

    Pair = collections.namedtuple("Pair", "first second")

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        table: torch.Tensor
        width: int = 3

    class Context:
        def __init__(self):
            self.storage = torch.ones(4)  # skipped: the KV storage is already on the device
            self.calls = [Frozen(torch.arange(3))]
            self.slots = {"pages": torch.zeros(2, dtype=torch.long)}
            self.exact = (torch.ones(1), 7, Pair(torch.ones(2), None))
            self.num_tokens = 5

    ctx = Context()
    found = step_tensors.collect(ctx, frozenset({"storage"}))
    assert sorted(found) == ["calls.0.table", "exact.0", "exact.2.0", "slots.pages"]
    step_tensors.replace(ctx, {k: v + 1 for k, v in found.items()}, frozenset({"storage"}))
    assert ctx.calls[0].table.tolist() == [1, 2, 3] and ctx.calls[0].width == 3
    assert ctx.slots["pages"].tolist() == [1, 1] and ctx.exact[1] == 7
    assert isinstance(ctx.exact[2], Pair) and ctx.exact[2].first.tolist() == [2.0, 2.0]
    assert ctx.storage.tolist() == [1.0] * 4 and ctx.num_tokens == 5


def test_counter_sees_syncs_only_inside_device_regions():
    x = torch.arange(6.0)
    with SyncCounter() as c:
        x.sum().item()  # host code may read host tensors
        with device_region():
            x.to(torch.float16)  # a dtype change is no copy between devices
            float(x[0]), bool(x[1]), int(x[2]), x.tolist(), x.cpu(), x.to("cpu")
            StepTransfers("cpu").download(x)  # the helper's own download is counted there
    assert dict(c.syncs) == {"__float__": 1, "__bool__": 1, "__int__": 1, "tolist": 1, "cpu": 1, "to": 1}
    assert c.transfers_outside_helper == 2


def _tensors(obj, seen=None):
    """Every tensor reachable from a step context's attributes (not its KV storage)."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        return [obj]
    if id(obj) in seen or isinstance(obj, (str, int, float, bool, type(None))):
        return []
    seen.add(id(obj))
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple)):
        items = obj
    else:
        items = [v for k, v in vars(obj).items() if k != "storage"] if hasattr(obj, "__dict__") else []
    return [t for item in items for t in _tensors(item, seen)]


def _counted_step(engine):
    before = engine.runner.transfers.counters.copy()
    with SyncCounter() as counter:
        events = engine.step()
    assert all(len(e.token_ids) == 1 for e in events if e.result is None), events
    return counter, engine.runner.transfers.counters - before


@pytest.mark.skipif(not dispatch.triton_importable(), reason="needs triton (interpreter)")
def test_cuda_decode_step_crosses_once_each_way_and_never_syncs():
    greedy = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(max_tokens=3, temperature=0.8, top_k=20, top_p=0.9, seed=1,
                             repetition_penalty=1.2, ignore_eos=True, logprobs=2)
    engine = engine_on("cuda")
    contexts, context = [], engine.backend.context
    engine.backend.context = lambda *a: contexts.append(context(*a)) or contexts[-1]
    for i in range(3):
        engine.add_request(random_ids(6 + 7 * i, 500, seed=i), greedy)
    engine.step()  # the prefills
    launches = dispatch.TRITON_LAUNCHES.copy()
    counter, traffic = _counted_step(engine)  # 3 greedy rows decode
    assert dispatch.TRITON_LAUNCHES - launches  # the Triton kernels ran
    assert counter.total_syncs == 0, dict(counter.syncs)
    assert counter.transfers_outside_helper == 0
    assert (traffic["uploads"], traffic["downloads"]) == (1, 1), dict(traffic)  # ids in, ids out
    assert traffic["bytes_down"] == 3 * 8, dict(traffic)
    # every index tensor the step's context reads lives in the one uploaded buffer
    index_tensors = _tensors(contexts[-1])
    assert index_tensors and len({t.untyped_storage().data_ptr() for t in index_tensors}) == 1
    engine.add_request(random_ids(4, 500, seed=9), sampled)
    engine.step()  # its prefill with the others' decode
    counter, traffic = _counted_step(engine)  # 3 greedy rows and a sampled one with log-probs
    assert counter.total_syncs == 0 and counter.transfers_outside_helper == 0, dict(counter.syncs)
    assert (traffic["uploads"], traffic["downloads"]) == (2, 1), dict(traffic)  # + sampler inputs
    assert traffic["bytes_down"] == (4 + 1 + 2 * 2) * 8, dict(traffic)  # ids, its log-probs
