"""`edge-runtime bench kv-groups` (edge_runtime/bench/layer_groups_bench.py) on a tiny random
Gemma 3 (one global and two local layers, window 24, 16-token pages): the bytes it reports are the
slices the sequence holds, and its ratio is below plan's bound."""

import json

from model_helpers import save_random_model, tiny_hf_config

from edge_runtime.cli import main


def test_bench_kv_groups_counts_the_slices_a_long_sequence_holds(tmp_path, capsys):
    folder = save_random_model(tiny_hf_config("gemma3", sliding_window=24), tmp_path / "g3", seed=4)
    out = tmp_path / "groups.json"
    assert main(["bench", "kv-groups", "--model", str(folder), "--tokens", "100",
                 "--page-tokens", "16", "--kv-dtype", "fp32", "--chunk", "32",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    got, row = report["measured"], report["row"]
    # 100 positions: 7 pages; the next query (read_from 99) reads keys > 75, pages 4-6 (64..111)
    assert (got["tokens"], got["pages"], got["local_pages"]) == (100, 7, 3)
    # a slice (one layer: G = gcd(1, 2)): K and V x 16 tokens x 2 kv heads x head_dim 32, fp32
    assert got["slice_bytes"] == 2 * 16 * 2 * 32 * 4
    assert got["all_layers_bytes"] == 7 * 3 * got["slice_bytes"]
    assert got["grouped_bytes"] == (7 + 3 * 2) * got["slice_bytes"]
    assert abs(row["ratio"] - 13 / 21) < 1e-9
    # plan: (1 x 100 + 2 x 48) / (3 x 100): a local layer holds at most 3 pages of 16
    assert abs(row["predicted_ratio"] - 196 / 300) < 1e-9 and row["ratio"] <= row["predicted_ratio"]
    assert "| 100 | 7 | 3 |" in capsys.readouterr().out
