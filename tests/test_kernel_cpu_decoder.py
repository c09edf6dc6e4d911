"""The one-call C decode step (kernels/cpu_decoder.py, kernels/csrc/decoder.c) against the model's
own torch layer loop over the same paged int8 KV: logits and the K/V it writes, for decode-only
steps over shared prefixes, private tail pages and inline tails, GQA, 1 and 2 threads; and when
it must not be used (prefill rows, fp32 KV, switched off)."""

import pytest
import torch

from engine_helpers import tiny_folder
from model_helpers import save_random_model, tiny_hf_config
from native_helpers import portable_library

from edge_runtime.kv.key_means import key_means_for
from edge_runtime.kv.storage import KVStorage
from edge_runtime.engine.backend import CpuBackend
from edge_runtime.kv.flat_context import FlatKVContext
from edge_runtime.kv.paged_context import SeqStep
from edge_runtime.kernels import cpu_decoder, cpu_linear, cpu_native, cpu_threads, hadamard
from edge_runtime.kernels.cpu_decoder import FusedDecoder
from edge_runtime.model.linear_packing import pack_linears
from edge_runtime.model.loader import load_model

pytestmark = pytest.mark.skipif(cpu_native.library() is None,
                                reason="kernels/csrc not built (no C compiler)")

P, SLOT = 8, 24
# (prefix pages, prefix_len, tail kind, tail ids, cached tail tokens): one decode token each
DECODE = [
    ((3, 5), 13, "inline", (0,), 10),  # prefix with a partial last page + inline tail
    ((), 0, "inline", (2,), 5),  # inline tail only
    ((7,), 8, "pages", (4, 6), 9),  # full-page prefix + tail over two pages
    ((3, 5), 13, "pages", (9,), 0),  # the first token after a shared partial prefix
    ((), 0, "pages", (12, 13), 12),  # pages only, no prefix
    ((7,), 8, "inline", (1,), 13, (10,)),  # a full tail page, then a slot
]


def _packed(folder):
    loaded = load_model(str(folder), progress=None)
    pack_linears(loaded.model)
    return loaded


def _storage(cfg, kv_dtype, seed, means=None):
    """A pool and an arena with random K/V in every slot (the history the decode rows attend to).
    means: centred int8 keys on these mean keys, about half the history's keys flagged centred."""
    st = KVStorage(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, num_pages=16, page_tokens=P,
                   num_inline_slots=3, inline_tokens=SLOT, kv_dtype=kv_dtype)
    if means is not None:
        st.set_key_means(means)
    g = torch.Generator().manual_seed(seed)
    for name in ("pages", "inline"):
        s = st.store(name)
        if kv_dtype == "int8":
            s.k.copy_(torch.randint(-127, 128, s.k.shape, generator=g, dtype=torch.int8))
            s.v.copy_(torch.randint(-127, 128, s.v.shape, generator=g, dtype=torch.int8))
            s.k_scale.copy_((torch.rand(s.k_scale.shape, generator=g) * 0.02 + 0.001).half())
            s.v_scale.copy_((torch.rand(s.v_scale.shape, generator=g) * 0.02 + 0.001).half())
            if means is not None:
                flip = torch.rand(s.k_scale.shape, generator=g) < 0.5
                s.k_scale.copy_(torch.where(flip, -s.k_scale, s.k_scale))
        else:
            s.k.copy_(torch.randn(s.k.shape, generator=g))
            s.v.copy_(torch.randn(s.v.shape, generator=g))
    return st


def _step(loaded, specs, kv_dtype, fused: bool, threads: int = 1, seed: int = 0, centred=False):
    """One forward of `specs` (one new token each) -> (logits, storage after the step); centred:
    the store centres keys on the model's mean keys (kv/key_means.py)."""
    cfg, model = loaded.config, loaded.model
    means = None
    if centred:
        rotated = kv_dtype == "int8" and hadamard.applies(cfg.head_dim)
        means = key_means_for(loaded, rotated)
    st = _storage(cfg, kv_dtype, seed, means)
    steps = [SeqStep(pages, plen, kind, ids, plen + cached, 1, *full)
             for pages, plen, kind, ids, cached, *full in specs]
    ctx = FlatKVContext(st, steps, sm_scale=cfg.head_dim ** -0.5)
    ids = torch.tensor([5 + 7 * i for i in range(len(steps))])
    positions = torch.tensor([s.start for s in steps])
    keep = model.fused_decoder
    try:
        if not fused:
            model.fused_decoder = None
        with cpu_threads.pinned_threads(threads):  # the back end applies the policy's count
            logits = CpuBackend(torch.device("cpu")).forward(model, ids, positions, ctx, None)
            assert torch.get_num_threads() == threads
    finally:
        model.fused_decoder = keep
    return logits, st


@pytest.fixture(scope="module")
def loaded():
    out = _packed(tiny_folder())
    assert isinstance(out.model.fused_decoder, FusedDecoder)
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("specs", [DECODE, DECODE[2:3], DECODE[:2]], ids=["mixed", "one", "inline"])
@pytest.mark.parametrize("centred", [False, True], ids=["plain", "centred"])
def test_fused_step_matches_the_layer_loop(loaded, specs, threads, centred):
    got, st_got = _step(loaded, specs, "int8", fused=True, threads=threads, centred=centred)
    want, st_want = _step(loaded, specs, "int8", fused=False, centred=centred)
    torch.testing.assert_close(got, want, atol=2e-4 * float(want.abs().max()), rtol=0)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    if centred:  # the step wrote centred keys: its writes below are compared with the loop's
        untouched = _storage(loaded.config, "int8", 0, st_got.k_means)
        new = [(st_got.store(n).k_scale != untouched.store(n).k_scale) for n in ("pages", "inline")]
        new_scales = torch.cat([st_got.store(n).k_scale[m] for n, m in zip(("pages", "inline"), new)])
        assert bool((new_scales < 0).any()), "no new key was centred: the test would not see the C writer"
    for name in ("pages", "inline"):  # the new tokens' K/V: the same int8 up to a rounding flip
        a, b = st_got.store(name), st_want.store(name)
        for x, y in ((a.k, b.k), (a.v, b.v)):
            diff = (x.int() - y.int()).abs()
            assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 1e-3
        torch.testing.assert_close(a.k_scale.float(), b.k_scale.float(), rtol=2e-3, atol=0)
        torch.testing.assert_close(a.v_scale.float(), b.v_scale.float(), rtol=2e-3, atol=0)


def _qwen2_gqa(tmp_path):
    """q/k/v and MLP biases, 3 query heads per kv head (qwen2-style attention bias), and an
    intermediate size (100) that is not a multiple of the linear's 16-output blocks."""
    folder = save_random_model(tiny_hf_config("qwen2", num_attention_heads=6, num_key_value_heads=2,
                                              hidden_size=96, intermediate_size=100),
                               tmp_path / "qwen2")
    return _packed(folder)


@pytest.mark.parametrize("model", ["llama", "qwen2"])
def test_the_thread_count_does_not_change_a_bit(loaded, tmp_path, model):
    """decoder.c splits every phase of a step over the team (columns of each linear, rows of the
    KV writes, attention tasks and the heads they rotate back, silu*up of the paired or unpaired
    gate/up columns): every value is computed by the same code whichever thread and however many,
    so 1, 2 and 3 threads give the same bits. A column, head or row that a split misses or
    computes twice shows here."""
    m = loaded if model == "llama" else _qwen2_gqa(tmp_path)
    centred = model == "qwen2"  # and centred keys, on the GQA model
    want, st_want = _step(m, DECODE, "int8", fused=True, threads=1, centred=centred)
    for threads in (2, 3):
        got, st_got = _step(m, DECODE, "int8", fused=True, threads=threads, centred=centred)
        assert torch.equal(got, want), threads
        for name in ("pages", "inline"):
            a, b = st_got.store(name), st_want.store(name)
            assert all(torch.equal(x, y) for x, y in ((a.k, b.k), (a.v, b.v), (a.k_scale, b.k_scale),
                                                       (a.v_scale, b.v_scale))), threads


def test_phase_timers_time_every_phase_and_restart(loaded, tmp_path, monkeypatch):
    """A build with EDGE_RUNTIME_CPU_PHASE_TIMES=1 (what `bench step --decoder-phases` reads) times
    each of the six phases on each thread, the phase at least as long as any thread's work in it,
    and a read restarts the timers; it computes the same bits; the default build has no timers."""
    import ctypes
    import shutil

    from edge_runtime.kernels.cpu_decoder import DECODER_PHASES, read_phase_times

    assert read_phase_times(cpu_native.library(), 2) is None
    monkeypatch.setenv(cpu_native.ENV_PHASE_TIMES, "1")
    target = tmp_path / "timed.so"
    cpu_native.compile_to(shutil.which("cc") or shutil.which("gcc"), target, cpu_native.build_flags())
    lib = cpu_native.declare(ctypes.CDLL(str(target)))
    want, _ = _step(loaded, DECODE, "int8", fused=True, threads=2)
    keep = loaded.model.fused_decoder
    try:
        loaded.model.fused_decoder = FusedDecoder(lib, loaded.model)
        read_phase_times(lib, 2)
        got, _ = _step(loaded, DECODE, "int8", fused=True, threads=2)
        times = read_phase_times(lib, 2)
        again = read_phase_times(lib, 2)
    finally:
        loaded.model.fused_decoder = keep
    assert torch.equal(got, want)
    assert [p["phase"] for p in times] == list(DECODER_PHASES)
    for p in times:
        assert p["all_s"] > 0 and len(p["work_s"]) == 2, p
        assert p["all_s"] >= max(p["work_s"]) > 0, p
    assert all(p["all_s"] == 0 and p["work_s"] == [0, 0] for p in again)


def test_bench_step_refuses_decoder_phases_without_timers(monkeypatch):
    from edge_runtime.bench import step_bench
    from edge_runtime.cli import build_parser
    from edge_runtime.errors import InputError

    monkeypatch.delenv("EDGE_RUNTIME_CPU_PHASE_TIMES", raising=False)
    args = build_parser().parse_args(["bench", "step", "--batch", "1", "--steps", "3",
                                      "--decoder-phases"])
    with pytest.raises(InputError, match="EDGE_RUNTIME_CPU_PHASE_TIMES=1"):
        step_bench.run(args)


def test_baseline_isa_build_matches(loaded):
    """kernels/csrc built without AVX2 (the code paths Arm compiles: plain int8 conversion,
    generic vector shuffles for the Hadamard butterflies and the score sums) gives the same step."""
    lib = portable_library()
    want, _ = _step(loaded, DECODE, "int8", fused=True)
    keep = loaded.model.fused_decoder
    try:
        loaded.model.fused_decoder = FusedDecoder(lib, loaded.model)
        got, _ = _step(loaded, DECODE, "int8", fused=True)
    finally:
        loaded.model.fused_decoder = keep
    torch.testing.assert_close(got, want, atol=2e-4 * float(want.abs().max()), rtol=0)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_fused_step_writes_exactly_the_new_rows(loaded):
    _, st = _step(loaded, DECODE, "int8", fused=True)
    untouched = _storage(loaded.config, "int8", seed=0)
    changed = 0
    for name in ("pages", "inline"):
        a, b = st.store(name), untouched.store(name)
        rows = (a.k != b.k).any(-1) | (a.v != b.v).any(-1)  # [blocks, layers, P, Hkv]
        changed += int(rows.any(-1).sum())
    # one token per sequence per layer; a rewritten random row differs in some byte for sure
    assert changed == len(DECODE) * loaded.config.num_layers


def test_biased_gqa_model(tmp_path):
    """q/k/v and MLP biases, 3 query heads per kv head (qwen2-style attention bias)."""
    loaded = _qwen2_gqa(tmp_path)
    assert loaded.model.fused_decoder is not None
    assert loaded.model.model.layers[0].self_attn.qkv_proj.bias is not None
    got, _ = _step(loaded, DECODE, "int8", fused=True, threads=2)
    want, _ = _step(loaded, DECODE, "int8", fused=False)
    torch.testing.assert_close(got, want, atol=2e-4 * float(want.abs().max()), rtol=0)


def test_used_for_prefill_rows_not_for_float_kv(loaded, monkeypatch):
    """A step with a prefill row runs in the one C call too (its tokens are gathered rows of the
    C attention, so a position computes the same in a prefill and in a decode step), with the
    logits of the layer loop; float KV runs the loop."""
    calls = []
    real = FusedDecoder.__call__
    monkeypatch.setattr(FusedDecoder, "__call__", lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg, model = loaded.config, loaded.model
    mixed = [SeqStep((3, 5), 13, "pages", (9,), 13, 4), SeqStep((7,), 8, "pages", (4, 6), 17, 1)]
    ids, positions = torch.arange(5, 10), torch.tensor([13, 14, 15, 16, 17])
    backend = CpuBackend(torch.device("cpu"))
    got = backend.forward(model, ids, positions, FlatKVContext(_storage(cfg, "int8", 0), mixed,
                                                               sm_scale=cfg.head_dim ** -0.5), None)
    assert calls == [1]
    keep, model.fused_decoder = model.fused_decoder, None
    try:
        want = backend.forward(model, ids, positions,
                               FlatKVContext(_storage(cfg, "int8", 0), mixed,
                                             sm_scale=cfg.head_dim ** -0.5), None)
    finally:
        model.fused_decoder = keep
    torch.testing.assert_close(got, want, atol=2e-4 * float(want.abs().max()), rtol=0)
    _step(loaded, DECODE, "fp32", fused=True)  # float KV: the torch path
    assert calls == [1]


def test_switches_and_backends_that_do_not_qualify(monkeypatch):
    monkeypatch.setenv(cpu_decoder.ENV_SWITCH, "0")
    assert _packed(tiny_folder()).model.fused_decoder is None
    monkeypatch.delenv(cpu_decoder.ENV_SWITCH)
    if cpu_linear.onednn_available():
        monkeypatch.setenv(cpu_linear.ENV_SWITCH, "onednn")
        assert _packed(tiny_folder()).model.fused_decoder is None


def _walk(ranges, per_step, left, steps):
    """read_ahead_walk over byte ranges [(begin, end)] -> (total lines, lines per step)."""
    import ctypes

    fn = cpu_native.library().read_ahead_walk  # a test hook: declared here, not in declare()
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                   ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    begin = (ctypes.c_void_p * len(ranges))(*[b for b, _ in ranges])
    end = (ctypes.c_void_p * len(ranges))(*[e for _, e in ranges])
    lines = (ctypes.c_int * steps)()
    total = fn(begin, end, len(ranges), per_step, left, steps, lines)
    return total, list(lines)


def test_read_ahead_walks_the_ranges_in_order_and_stops_at_its_budget():
    # ranges of 3, 0 and 2 lines (the empty one is skipped), 2 lines per step
    base = 1 << 20
    ranges = [(base, base + 3 * 64), (base + 4096, base + 4096), (base + 8192, base + 8192 + 100)]
    assert _walk(ranges, 2, 100, 5) == (5, [2, 2, 1, 0, 0])  # the end of the last range
    assert _walk(ranges, 2, 3, 5) == (3, [2, 1, 0, 0, 0])  # the budget
    assert _walk(ranges, 0, 100, 3) == (0, [0, 0, 0])
    assert _walk([(base, base)], 4, 100, 2) == (0, [0, 0])


def _qwen3(tmp_path):
    """Qwen3: RMSNorm of each q and k head before rope, head_dim 32 (not hidden / heads)."""
    folder = save_random_model(tiny_hf_config("qwen3"), tmp_path / "qwen3")
    return _packed(folder)


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_step_does_the_qwen3_head_norms(tmp_path, threads):
    m = _qwen3(tmp_path)
    assert isinstance(m.model.fused_decoder, FusedDecoder)
    got, _ = _step(m, DECODE, "int8", fused=True, threads=threads)
    want, _ = _step(m, DECODE, "int8", fused=False)
    torch.testing.assert_close(got, want, atol=2e-4 * float(want.abs().max()), rtol=0)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_gemma3_runs_the_layer_loop(tmp_path):
    folder = save_random_model(tiny_hf_config("gemma3"), tmp_path / "gemma3")
    assert _packed(folder).model.fused_decoder is None  # its layer is not decoder.c's
