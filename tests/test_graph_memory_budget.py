"""The decode graphs' memory, measured when they are captured at start (on a GPU), is counted in
the budget's activation_reserve (service/engine_setup.py `check_graph_memory`)."""

import logging
from pathlib import Path

import pytest

from edge_runtime.budget import load_budget
from edge_runtime.errors import ConfigError
from edge_runtime.service.engine_setup import check_graph_memory

BUDGET = load_budget(Path(__file__).resolve().parents[1] / "configs" / "orin" / "cpu-dev.yaml")  # 1 GiB reserve


class _Engine:
    def __init__(self, graphs):
        self.graphs = graphs

    def stats(self):
        return {"decode_graphs": self.graphs}


def _graphs(mib):
    return {"capture_bytes": mib * 2**20, "capture_s": 0.4, "captured": [1, 2, 4, 8, 16]}


def test_graphs_within_the_activation_reserve_are_logged(caplog):
    with caplog.at_level(logging.INFO):
        check_graph_memory(_Engine(_graphs(6)), BUDGET)
    assert "6 MiB (counted in activation_reserve)" in caplog.text


def test_graphs_past_the_activation_reserve_refuse_the_budget_with_the_numbers():
    with pytest.raises(ConfigError) as exc:
        check_graph_memory(_Engine(_graphs(1500)), BUDGET)
    message = str(exc.value)
    assert message.startswith(f"{BUDGET.source}: ")  # the file to edit
    assert "1500 MiB" in message and "activation_reserve (1024 MiB)" in message
    assert "at least 1500 MiB" in message


@pytest.mark.parametrize("graphs", [None, {}, {"capture_bytes": 0}])
def test_no_captured_graphs_count_nothing(graphs):
    check_graph_memory(_Engine(graphs), BUDGET)  # CPU back end, interpreter, capture failed
    check_graph_memory(_Engine(_graphs(1500)), None)  # no budget: nothing to count against
