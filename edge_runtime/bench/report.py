"""Rendering benchmark results: markdown tables on stdout, JSON files, PNG plots.

Rows are plain dicts (JSON-ready). A `Column` says which key to show and how to format it, so the
same rows feed the table and the JSON file; the JSON always holds every key, the table a selection.
Missing values (None) print as "n/a" / "unavailable", never as 0.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from edge_runtime.paths import check_output_file


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: Callable[[Any], str] | str = "{}"
    missing: str = "n/a"

    def render(self, row: dict) -> str:
        value = row.get(self.key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return self.missing
        if callable(self.fmt):
            return self.fmt(value)
        return self.fmt.format(value)


def markdown_table(rows: Sequence[dict], columns: Sequence[Column]) -> str:
    """A GitHub-flavoured markdown table; numeric-looking columns are right-aligned."""
    header = "| " + " | ".join(c.header for c in columns) + " |"
    cells = [[c.render(r) for c in columns] for r in rows]
    aligns = []
    for i, _ in enumerate(columns):
        numeric = all(_looks_numeric(row[i]) for row in cells) and bool(cells)
        aligns.append("---:" if numeric else "---")
    sep = "|" + "|".join(aligns) + "|"
    body = ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join([header, sep, *body])


def _looks_numeric(text: str) -> bool:
    head = text.split(" ")[0].rstrip("%x×")
    try:
        float(head)
    except ValueError:
        return text in ("n/a", "unavailable")
    return True


def machine_info() -> dict:
    """What the numbers were measured on (CPU model, cores, RAM, torch threads, load)."""
    info: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
    }
    try:
        import psutil

        info["ram_total_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:  # psutil is a core dependency; keep the report usable without it
        info["ram_total_gib"] = None
    try:
        info["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        info["load_avg_1m"] = None
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_json(path: str | os.PathLike, payload: dict) -> Path:
    """Write `payload` (with a `machine` section added if absent) as indented JSON."""
    out = Path(path)
    check_output_file(out, "--json")
    payload = dict(payload)
    payload.setdefault("machine", machine_info())
    out.write_text(json.dumps(payload, indent=2, sort_keys=False, default=_json_default) + "\n")
    return out


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def fmt_num(digits: int = 1) -> Callable[[float], str]:
    return lambda v: f"{v:.{digits}f}"


def fmt_ms(v: float) -> str:
    return f"{v * 1000:.1f}"


def fmt_mib(v: float) -> str:
    return f"{v / 2**20:.2f}"


def fmt_pct(v: float) -> str:
    return f"{v * 100:.0f}%"
