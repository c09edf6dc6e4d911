"""Bad `bench` arguments fail up front with one line (InputError, exit 2), before any model load."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from edge_runtime.cli import build_parser, main  # noqa: E402
from edge_runtime.errors import InputError  # noqa: E402

NO_MODEL = "/nonexistent-model"
# Cheapest arguments of each subcommand: a missing model, so a check that is not up front shows up
# as a different error (model not found) instead of a long run.
MINIMAL = {
    "attention": ["--rows", "1", "--keys", "16", "--layers", "1", "--repeat", "1",
                  "--flush-mib", "0"],
    "engine": ["--model", NO_MODEL, "--bandwidth-mib", "1"],
    "linear": ["--model", NO_MODEL, "--bandwidth-mib", "1"],
    "logits": ["--model", NO_MODEL],
    "service": ["--model", NO_MODEL],
    "startup": ["--model", NO_MODEL],
    "step": ["--model", NO_MODEL],
    "trace": ["--model", NO_MODEL, "--trace", "/nonexistent-trace.jsonl"],
    "weights": ["--model", NO_MODEL, "--awq", NO_MODEL],
}


def _bench_parsers():
    parser = build_parser()
    bench = next(a for a in parser._subparsers._group_actions[0].choices.items()
                 if a[0] == "bench")[1]
    return bench._subparsers._group_actions[0].choices


def test_every_subcommand_is_listed_here():
    assert set(_bench_parsers()) == set(MINIMAL)


@pytest.mark.parametrize("sub", sorted(MINIMAL))
@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_output_path_checked_before_the_run(sub, flag, tmp_path, capsys):
    if flag not in _bench_parsers()[sub]._option_string_actions:
        pytest.skip(f"bench {sub} has no {flag}")
    for bad, why in [(tmp_path / "missing" / "out", "does not exist"),
                     (tmp_path, "is a folder")]:
        rc = main(["bench", sub, *MINIMAL[sub], flag, str(bad)])
        err = capsys.readouterr().err
        assert rc == 2 and f"{flag} " in err and why in err, err
        assert "Traceback" not in err
