"""A random-weight Gemma 3 checkpoint with the KV shape of Gemma 3 270M: 18 layers, every sixth
global and the others local with a 512-token window, one KV head of head_dim 256, 32k context;
everything else tiny (hidden 64, one query head, a 512-token vocabulary), so a long sequence runs
in seconds on a CPU. What `edge-runtime bench kv-groups` measures the layer groups' bytes on
(docs/pool.md, "Layer groups"): the KV bytes depend on the KV shape alone.

    .venv/bin/python tools/kv_groups_checkpoint.py --out /tmp/gemma3-270m-kv-shape
    .venv/bin/edge-runtime bench kv-groups --model /tmp/gemma3-270m-kv-shape --tokens 8192
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from source_tree import import_edge_runtime  # noqa: E402 - tools/ just went on sys.path

import_edge_runtime()
from lab.random_models import save_random_model, tiny_hf_config  # noqa: E402

LAYERS = 18
WINDOW = 512


def kv_shape_config():
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(LAYERS)]
    return tiny_hf_config("gemma3", num_hidden_layers=LAYERS, layer_types=types,
                          sliding_window=WINDOW, num_attention_heads=1, num_key_value_heads=1,
                          head_dim=256, query_pre_attn_scalar=256, intermediate_size=64,
                          max_position_embeddings=32768)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder to write the checkpoint to")
    args = parser.parse_args()
    folder = save_random_model(kv_shape_config(), Path(args.out), seed=3)
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
