"""PNG of a trace replay: TTFT distribution per system (empirical CDF) and KV bytes over time.

matplotlib is imported lazily with the Agg backend (no display on a Jetson service or in CI).
Input per system: `ttft_s` (list of seconds) and `kv_timeline` (list of [t_seconds, kv_bytes]).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from edge_runtime.errors import InputError


def plot_trace(path: str | Path, per_system: Mapping[str, dict], title: str = "") -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise InputError(
            "--plot needs matplotlib: pip install 'edge-runtime[bench]'"
        ) from exc
    out = Path(path)
    if not out.parent.exists():
        raise InputError(f"cannot write {out}: folder {out.parent} does not exist")
    fig, (ax_ttft, ax_kv) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, data in per_system.items():
        ttfts = sorted(t * 1000 for t in data.get("ttft_s", []))
        if ttfts:
            ys = [(i + 1) / len(ttfts) for i in range(len(ttfts))]
            ax_ttft.step(ttfts, ys, where="post", label=name)
        timeline = data.get("kv_timeline") or []
        if timeline:
            ax_kv.plot([t for t, _ in timeline], [b / 2**20 for _, b in timeline], label=name)
    ax_ttft.set_xscale("log")
    ax_ttft.set_xlabel("time to first token (ms, log)")
    ax_ttft.set_ylabel("fraction of requests")
    ax_ttft.set_title("TTFT distribution")
    ax_ttft.grid(True, alpha=0.3)
    ax_ttft.legend()
    ax_kv.set_xlabel("time since replay start (s)")
    ax_kv.set_ylabel("KV bytes held (MiB)")
    ax_kv.set_title("KV cache held over time")
    ax_kv.grid(True, alpha=0.3)
    ax_kv.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
