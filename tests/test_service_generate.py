"""service/generate.py checks that need the model's sizes, on stand-in state (no model loaded)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edge_runtime.service.generate import _check_length
from edge_runtime.service.limits import ServiceLimits
from edge_runtime.service.schema import ApiError, parse_completion


def _state(context_len: int = 64):
    return SimpleNamespace(limits=ServiceLimits(), context_len=context_len)


def test_context_error_names_the_key_the_client_sent():
    state = _state(64)
    for key in ("max_tokens", "max_completion_tokens"):
        req = parse_completion({"prompt": "x", key: 40}, 512)
        with pytest.raises(ApiError) as e:
            _check_length(state, list(range(30)), req)
        assert e.value.code == "context_length_exceeded" and e.value.param == key
        assert f"lower {key}" in e.value.message
