"""PackedLinear (kernels/cpu_linear.py, both backends) against F.linear, and model/linear_packing.py
on a random Llama: fused q/k/v and gate/up, packed LM head, the same logits as the unpacked model."""

import pytest
import torch
from torch import nn

from model_helpers import our_logits, random_ids
from engine_helpers import tiny_folder

from edge_runtime.kernels import cpu_linear, cpu_native
from edge_runtime.kernels.cpu_linear import BlockedEmbedding, PackedLinear, packable
from edge_runtime.model.loader import load_model
from edge_runtime.model.linear_packing import pack_linears

pytestmark = pytest.mark.skipif(not cpu_linear.available(), reason="no packed linear backend")

KINDS = [pytest.param("c-blocked", marks=pytest.mark.skipif(
             cpu_native.library() is None, reason="kernels/csrc not built (no C compiler)")),
         pytest.param("onednn", marks=pytest.mark.skipif(
             not cpu_linear.onednn_available(), reason="torch without oneDNN linear ops"))]


def _linear(k, n, bias, seed):
    torch.manual_seed(seed)
    m = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        m.weight.normal_()
        if bias:
            m.bias.normal_()
    return m


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 2, 5, 7, 12, 13, 16, 31, 32, 37, 100])
@pytest.mark.parametrize("outs,bias", [((48,), False), ((40, 24, 24), True), ((96, 96), False),
                                       ((13, 7), True)])
def test_packed_linear_matches_f_linear(kind, rows, outs, bias):
    parts = [_linear(40, n, bias, seed=i) for i, n in enumerate(outs)]
    packed = PackedLinear(parts, kind=kind)
    x = torch.randn(rows, 40)
    got = packed(x)
    assert got.shape == (rows, sum(outs)) and packed.out_splits == outs
    want = packed.reference_forward(x, parts)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for part, y in zip(parts, got.split(outs, dim=-1)):  # each part's rows are its own linear
        torch.testing.assert_close(y, part(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_packed_linear_takes_strided_and_batched_inputs(kind):
    part = _linear(64, 40, True, seed=7)
    packed = PackedLinear([part], kind=kind)
    wide = torch.randn(9, 100)
    x = wide[:, 10:74]  # rows 100 floats apart, a view as the q/k/v split makes
    torch.testing.assert_close(packed(x), part(x), atol=1e-5, rtol=1e-5)
    x3 = torch.randn(2, 3, 64)
    torch.testing.assert_close(packed(x3), part(x3), atol=1e-5, rtol=1e-5)
    assert packed(torch.randn(0, 64)).shape == (0, 40)


@pytest.mark.skipif(cpu_native.library() is None, reason="kernels/csrc not built (no C compiler)")
def test_c_kernel_every_row_pass_and_row_block():
    """The C kernel itself at every row count of a pass (1-12: AVX-512 builds take 12 rows a
    pass, others 6) and across the 48-row blocks, whatever GEMM_MIN_ROWS sends to it; a row's
    outputs do not depend on how many rows share its pass (bit-identical to that row alone)."""
    part = _linear(80, 72, True, seed=9)
    packed = PackedLinear([part], kind="c-blocked")
    x = torch.randn(50, 80)
    alone = [packed.c_kernel(x[i:i + 1]) for i in range(x.shape[0])]
    for rows in [*range(1, 26), 47, 48, 49, 50]:
        got = packed.c_kernel(x[:rows])
        torch.testing.assert_close(got, part(x[:rows]), atol=1e-4, rtol=1e-4)
        assert torch.equal(got, torch.cat(alone[:rows])), rows


@pytest.mark.skipif(cpu_native.library() is None, reason="kernels/csrc not built (no C compiler)")
def test_c_blocked_linear_is_the_same_for_any_thread_count():
    part = _linear(96, 200, True, seed=8)
    packed = PackedLinear([part], kind="c-blocked")
    x = torch.randn(13, 96)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = packed(x)
        torch.set_num_threads(2)
        two = packed(x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)  # each output's sum is one thread's, in k order
    torch.testing.assert_close(one, part(x), atol=1e-5, rtol=1e-5)


def test_only_plain_fp32_cpu_linears_are_packed():
    assert packable(nn.Linear(8, 8))
    assert not packable(nn.Linear(8, 8).half())
    assert not packable(nn.Identity())

    class Sub(nn.Linear):
        pass

    assert not packable(Sub(8, 8))  # e.g. a quantized replacement deriving from nn.Linear
    with pytest.raises(AssertionError, match="share the input size"):
        PackedLinear([nn.Linear(8, 4), nn.Linear(6, 4)])


def test_pack_linears_keeps_the_model_function():
    loaded = load_model(str(tiny_folder()), progress=None)  # its own copy: engines pack tiny()'s
    model = loaded.model
    ids = random_ids(37, loaded.config.vocab_size, seed=3)
    want = our_logits(model, ids)
    count = pack_linears(model)
    layers = loaded.config.num_layers
    assert count == 4 * layers + 1  # qkv, o, gate_up, down per layer + the LM head
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert isinstance(attn.qkv_proj, PackedLinear) and not hasattr(attn, "q_proj")
    assert isinstance(mlp.gate_up_proj, PackedLinear) and not hasattr(mlp, "gate_proj")
    got = our_logits(model, ids)
    torch.testing.assert_close(got, want, atol=1e-4 * float(want.abs().max()), rtol=0)
    assert pack_linears(model) == count  # once only


def test_dense_switch_leaves_the_model_alone(monkeypatch):
    monkeypatch.setenv(cpu_linear.ENV_SWITCH, "dense")
    model = load_model(str(tiny_folder()), progress=None).model
    assert pack_linears(model) == 0
    assert isinstance(model.model.layers[0].self_attn.q_proj, nn.Linear)


@pytest.mark.parametrize("kind", KINDS)
def test_tied_head_shares_the_embedding(tmp_path, monkeypatch, kind):
    from model_helpers import save_random_model, tiny_hf_config

    monkeypatch.setenv(cpu_linear.ENV_SWITCH, kind)
    folder = save_random_model(tiny_hf_config("llama", tie_word_embeddings=True), tmp_path / "tied")
    loaded = load_model(str(folder), progress=None)
    model = loaded.model
    ids = random_ids(21, loaded.config.vocab_size, seed=5)
    want = our_logits(model, ids)
    table = model.model.embed_tokens.weight.detach().clone()
    pack_linears(model)
    head, embed = model.lm_head, model.model.embed_tokens
    assert isinstance(head, PackedLinear) and head.kind == kind
    if kind == "c-blocked":  # the embedding reads the head's blocked tensor
        assert isinstance(embed, BlockedEmbedding) and embed.blocked is head.packed
        every = torch.arange(loaded.config.vocab_size)
        assert torch.equal(embed(every), table)
        assert torch.equal(embed(every.view(2, -1)), table.view(2, -1, table.shape[1]))
    else:
        assert not head.reordered
        assert head.packed.data_ptr() == embed.weight.data_ptr()  # no second copy of the matrix
    torch.testing.assert_close(our_logits(model, ids), want, atol=1e-4 * float(want.abs().max()), rtol=0)
