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


def _output_flags():
    return [(sub, flag) for sub, p in sorted(_bench_parsers().items())
            for flag in ("--json", "--plot") if flag in p._option_string_actions]


def test_every_subcommand_writes_json():
    assert {sub for sub, flag in _output_flags() if flag == "--json"} == set(MINIMAL)


@pytest.mark.parametrize("sub,flag", _output_flags())
def test_output_path_checked_before_the_run(sub, flag, tmp_path, capsys):
    for bad, why in [(tmp_path / "missing" / "out", "does not exist"),
                     (tmp_path, "is a folder")]:
        rc = main(["bench", sub, *MINIMAL[sub], flag, str(bad)])
        err = capsys.readouterr().err
        assert rc == 2 and f"{flag} " in err and why in err, err
        assert "Traceback" not in err


def test_parse_int_list_refuses_empty_items():
    from edge_runtime.bench.checks import parse_int_list

    assert parse_int_list(" 1, 2,5", "--batch") == [1, 2, 5]
    for bad in ("1,,5", "1,", ",", "", "abc", "0", "-1", "1.5"):
        with pytest.raises(InputError, match="--batch"):
            parse_int_list(bad, "--batch")


BAD_ARGS = [  # (subcommand, extra arguments, the flag the error must name)
    ("engine", ["--batch", "1,,5"], "--batch"),
    ("engine", ["--prompt-tokens", "0"], "--prompt-tokens"),
    ("engine", ["--gen-tokens", "1"], "--gen-tokens"),
    ("engine", ["--repeat", "0"], "--repeat"),
    ("engine", ["--bandwidth-mib", "0"], "--bandwidth-mib"),
    ("engine", ["--bandwidth-mib", str(2**40)], "--bandwidth-mib"),
    ("linear", ["--rows", "1,"], "--rows"),
    ("linear", ["--bandwidth-mib", "-1"], "--bandwidth-mib"),
    ("linear", ["--repeat", "0"], "--repeat"),
    ("step", ["--prompt-tokens", "0"], "--prompt-tokens"),
    ("step", ["--steps", "2"], "--steps"),
    ("step", ["--profile", "-1"], "--profile"),
    ("attention", ["--kv-heads", "0"], "--kv-heads"),
    ("attention", ["--head-dim", "0"], "--head-dim"),
    ("attention", ["--page-tokens", "0"], "--page-tokens"),
    ("attention", ["--flush-mib", "-1"], "--flush-mib"),
    ("attention", ["--keys", "100000000000"], "--keys"),
    ("weights", ["--batch", "1,,2"], "--batch"),
    ("weights", ["--prompt-tokens", "0"], "--prompt-tokens"),
    ("startup", ["--repeat", "0"], "--repeat"),
    ("logits", ["--lengths", "1,,abc"], "--lengths"),
    ("logits", ["--lengths", "0"], "--lengths"),
    ("service", ["--streams", "0"], "--streams"),
    ("service", ["--max-tokens", "0"], "--max-tokens"),
    ("trace", ["--num-pages", "0"], "--num-pages"),
    ("trace", ["--page-tokens", "0"], "--page-tokens"),
]


@pytest.mark.parametrize("sub,extra,flag", BAD_ARGS)
def test_bad_numbers_are_one_line_errors_before_the_load(sub, extra, flag, capsys):
    rc = main(["bench", sub, *MINIMAL[sub], *extra])
    err = capsys.readouterr().err
    assert rc == 2 and flag in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("sub,extra", [
    ("engine", ["--batch", "1", "--prompt-tokens", "16", "--gen-tokens", "100000000"]),
    ("engine", ["--batch", "40", "--prompt-tokens", "600", "--gen-tokens", "2"]),
    ("step", ["--batch", "1", "--prompt-tokens", "100000000"]),
])
def test_kv_pool_too_small_is_refused_before_the_load(sub, extra, capsys):
    rc = main(["bench", sub, *MINIMAL[sub], *extra])
    err = capsys.readouterr().err
    assert rc == 2 and "KV pages" in err and len(err.strip().splitlines()) == 1, err


def test_bad_target_scheme_is_refused_before_the_trace_is_read(capsys):
    rc = main(["bench", "trace", *MINIMAL["trace"], "--target", "ftp://x"])
    err = capsys.readouterr().err
    assert rc == 2 and "--target must be unix:PATH or http://HOST:PORT" in err, err
