"""The Hadamard rotation of int8 KV heads (kernels/hadamard.py): exact transform, when it applies,
and that it lowers the int8 error of attention scores on keys with outlier channels."""

import pytest
import torch

from edge_runtime.kv.storage import KVStorage
from edge_runtime.kernels import hadamard
from edge_runtime.kernels.quantize import dequantize_int8, quantize_int8


@pytest.mark.parametrize("d", [2, 16, 64, 128])
def test_rotate_is_the_orthonormal_hadamard_matrix_and_its_own_inverse(d):
    x = torch.randn(3, 5, d, dtype=torch.float64)
    h = hadamard.matrix(d, torch.float64)
    torch.testing.assert_close(hadamard.rotate(x), x @ h)
    torch.testing.assert_close(h @ h.T, torch.eye(d, dtype=torch.float64))
    torch.testing.assert_close(hadamard.rotate(hadamard.rotate(x)), x)
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    torch.testing.assert_close(hadamard.rotate(q) @ hadamard.rotate(k), q @ k)


def test_only_int8_stores_with_power_of_two_heads_are_rotated():
    assert KVStorage(2, 1, 64, num_pages=2, page_tokens=4, kv_dtype="int8").rotated
    assert not KVStorage(2, 1, 64, num_pages=2, page_tokens=4, kv_dtype="fp16").rotated
    assert not KVStorage(2, 1, 80, num_pages=2, page_tokens=4, kv_dtype="int8").rotated
    with pytest.raises(AssertionError, match="power-of-two"):
        hadamard.rotate(torch.zeros(3, 80))


def test_rotation_lowers_int8_score_error_on_outlier_channels():
    g = torch.Generator().manual_seed(0)
    k = torch.randn(512, 1, 64, generator=g)
    k[..., 3] *= 30.0  # a few large channels set each token's absmax (as rope channels do)
    k[..., 40] += 12.0
    q = torch.randn(64, 64, generator=g)

    def score_error(rotated: bool) -> float:
        kk = hadamard.rotate(k) if rotated else k
        back = dequantize_int8(*quantize_int8(kk))
        back = hadamard.rotate(back) if rotated else back
        return float(((q @ back[:, 0].T) - (q @ k[:, 0].T)).abs().mean())

    assert score_error(True) < 0.5 * score_error(False)
