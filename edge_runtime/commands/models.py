"""`edge-runtime models [MODEL ...] [--json]`: the models this machine has and what each budget gives them.

Listed: the built-in model, every model in the models folder ($EDGE_RUNTIME_MODELS, default
$XDG_DATA_HOME/edge-runtime/models: `NAME.gguf` files and Hugging Face folders; model/model_names.py),
then each MODEL given (a path or a name). Each row: architecture, parameters, block types (GGUF) or
dtypes (safetensors), bytes on disk, and for every budget in configs/orin/ the streams of
2,048 tokens that fit: `plan`'s own computation (edge_runtime/plan.py `model_for_plan` +
`make_plan`, with the budget's stream_context_tokens set to 2,048), on the device `--device`
picks for that budget (as `plan --device`). "-" is a budget the model does not fit (not one page
after the weights), with the reason below the table.

A model that cannot be read or planned (an unknown name, an unreadable file, an architecture or a
block type the runtime does not serve) gets its reason in its row's notes; the others still print,
and the exit status is 1 when any model had a problem.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from edge_runtime.budget import available_budgets, load_budget
from edge_runtime.errors import ConfigError, EdgeError
from edge_runtime.paths import models_dir
from edge_runtime.plan import gguf_blocks_served, make_plan, model_for_plan
from edge_runtime.engine.placement import model_weights, resolve

STREAM_TOKENS = 2048


def register(subparsers) -> None:
    p = subparsers.add_parser("models", help="the models this machine has and the budgets each fits",
                              description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="*", help="more models to list: a .gguf file, a Hugging Face "
                                            "folder or a model name")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--device", default="auto",
                   help="the device each budget is planned for: auto (the budget's device:, else "
                        "cuda when torch sees one, else cpu), cpu, cuda or cuda:N; needs no GPU")
    p.set_defaults(func=run)


def run(args) -> int:
    from edge_runtime.model.model_names import known_models  # start-up time: the model package imports torch

    budgets = [load_budget(name) for name in available_budgets()]
    entries = [(m.name, m.origin, m.path, m.problem) for m in known_models()]
    entries += [(given, "given", None, "") for given in args.model]
    rows = []
    for name, origin, path, problem in entries:
        print(f"reading {name} ...", file=sys.stderr, flush=True)
        rows.append(model_row(name, origin, path, problem, budgets, args.device))
    report = {"models_folder": str(models_dir()), "stream_tokens": STREAM_TOKENS,
              "budgets": [b.name for b in budgets], "models": rows}
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 1 if any(row["problem"] for row in rows) else 0


def model_row(name: str, origin: str, path, problem: str, budgets: list, device: str) -> dict:
    """One model's row: its info and, per budget, the plan's streams (or why it has none)."""
    from edge_runtime.model.model_info import describe_model  # start-up time: imports torch
    from edge_runtime.model.model_names import model_path  # start-up time, as above

    row = {"name": name, "origin": origin, "path": str(path) if path else None, "format": None,
           "architecture": None, "parameters": None, "block_types": {}, "file_bytes": None,
           "budgets": {}, "problem": problem}
    if problem:
        return row
    try:
        path = path or model_path(name)
        row["path"] = str(path)
        row.update(dataclasses.asdict(describe_model(path)))
        row["budgets"] = {b.name: budget_fit(str(path), b, device) for b in budgets}
    except EdgeError as exc:
        row["problem"] = str(exc)
    except OSError as exc:  # a file or folder that cannot be read: its row says so, the rest print
        row["problem"] = f"cannot read {exc.filename or path}: {exc.strerror}; check its permissions"
    return row


def budget_fit(model: str, budget, device: str) -> dict:
    """The plan of `model` under `budget` for streams of STREAM_TOKENS tokens. A budget with no
    room is a result ("does not fit", with plan's reason); a model that cannot be planned raises."""
    placement = resolve(device, None, budget, need_device=False)
    weights = model_weights(placement)
    config, weight_bytes, _ = model_for_plan(model, placement.weight_dtype, weights, placement.device)
    check_blocks(model, weights, placement)
    streams_budget = dataclasses.replace(budget, stream_context_tokens=STREAM_TOKENS)
    fit = {"device": placement.device, "weight_dtype": placement.weight_dtype,
           "weight_bytes": weight_bytes}
    try:
        plan = make_plan(streams_budget, config, weight_bytes, model_name=model)
    except ConfigError as exc:
        return {**fit, "fits": False, "streams": 0, "reason": str(exc)}
    return {**fit, "fits": plan.streams_that_fit > 0, "streams": plan.streams_that_fit,
            "kv_bytes_per_token": plan.kv_bytes_per_token, "num_pages": plan.num_pages,
            "reason": "" if plan.streams_that_fit else
            f"{plan.num_pages} pages of {plan.page_tokens} tokens hold no {STREAM_TOKENS}-token stream"}


def check_blocks(model: str, weights: str, placement) -> None:
    """A GGUF the loader would serve from its blocks holds only block types it serves (the
    loader's refusal, raised here instead of at load; the plan alone counts such a type as floats)."""
    from edge_runtime.model.gguf_int4 import check_served  # start-up time: imports torch
    from edge_runtime.model.gguf_tensors import GGUFTensors  # start-up time: imports numpy
    from edge_runtime.model.model_names import gguf_path  # start-up time, as above

    source = gguf_path(model)
    if source is not None and gguf_blocks_served(source, weights, placement.weight_dtype,
                                                 placement.device):
        check_served(GGUFTensors(source))


def _count(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= unit:
            return f"{n / unit:.1f}{suffix}"
    return str(n)


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.1f} MiB"


def format_report(report: dict) -> str:
    budgets = report["budgets"]
    head = ["model", "origin", "architecture", "parameters", "block types", "bytes", *budgets]
    lines = [f"models folder: {report['models_folder']} ($EDGE_RUNTIME_MODELS)",
             f"budget columns: streams of {report['stream_tokens']:,} tokens that fit (configs/orin/; "
             "- = does not fit)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for row in report["models"]:
        kinds = ", ".join(f"{k} x{n}" for k, n in row["block_types"].items())
        cells = [row["name"], row["origin"], row["architecture"] or "?", _count(row["parameters"]),
                 kinds or "?", _mib(row["file_bytes"])]
        for b in budgets:
            fit = row["budgets"].get(b)
            cells.append("?" if fit is None else str(fit["streams"]) if fit["fits"] else "-")
            if fit and fit["reason"]:
                notes.append(f"{row['name']} in {b}: {fit['reason']}")
        if row["problem"]:
            notes.append(f"{row['name']}: {row['problem']}")
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "notes:", *(f"  {n}" for n in notes)]
    return "\n".join(lines)
