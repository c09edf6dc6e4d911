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
    "grammar": ["--model", NO_MODEL],
    "kv-groups": ["--model", NO_MODEL],
    "linear": ["--model", NO_MODEL, "--bandwidth-mib", "1"],
    "linear-rows": ["--rows", "1", "--k", "16", "--n", "16", "--copies", "1", "--repeat", "1"],
    "logits": ["--model", NO_MODEL],
    "peer": ["--llama-server", "/nonexistent-llama-server"],
    "service": ["--model", NO_MODEL],
    "startup": ["--model", NO_MODEL],
    "step": ["--model", NO_MODEL],
    "threads": ["--model", NO_MODEL],
    "trace": ["--model", NO_MODEL, "--trace", "/nonexistent-trace.jsonl"],
    "weights": ["--model", NO_MODEL, "--awq", NO_MODEL],
    "wyoming": ["--model", NO_MODEL],
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
    with pytest.raises(InputError, match="--batch lists 1, 5 more than once"):
        parse_int_list("1,5,1,5,2", "--batch")


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
    ("linear-rows", ["--rows", "1,,2"], "--rows"),
    ("linear-rows", ["--copies", "0"], "--copies"),
    ("linear-rows", ["--k", "0"], "--k"),
    ("threads", ["--rounds", "0"], "--rounds"),
    ("threads", ["--gen", "1"], "--gen"),
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
    ("engine", ["--batch", "1,1"], "--batch"),
    ("engine", ["--prompt-tokens", "8,8"], "--prompt-tokens"),
    ("engine", ["--recent-window", "-1"], "--recent-window"),
    ("step", ["--recent-window", "-1"], "--recent-window"),
    ("trace", ["--recent-window", "-1"], "--recent-window"),
    ("trace", ["--systems", "edge,hf,edge"], "--systems"),
    ("trace", ["--from-json", ""], "--from-json"),
    ("trace", ["--from-json", ","], "--from-json"),
    ("trace", ["--from-json", "/"], "--from-json"),
    ("trace", ["--target", "http://127.0.0.1:notaport"], "--target"),
    ("trace", ["--target", "http://[::1"], "--target"),
    ("grammar", ["--batch", "1,,5"], "--batch"),
    ("grammar", ["--gen-tokens", "1"], "--gen-tokens"),
    ("grammar", ["--repeat", "0"], "--repeat"),
    ("peer", ["--busy", "0,x"], "--busy"),
    ("peer", ["--rounds", "0"], "--rounds"),
    ("peer", ["--slot-context", "8"], "--slot-context"),
    ("peer", [], "--llama-server"),
    ("wyoming", ["--clients", "0"], "--clients"),
    ("wyoming", ["--turns", "5"], "--turns"),
    ("wyoming", ["--stagger", "-1"], "--stagger"),
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


def test_outputs_never_overwrite_the_trace_or_each_other(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text("{}\n")
    for extra, message in [
            (["--json", str(trace)], "is the --trace file this run reads"),
            (["--json", str(tmp_path / "a.png"), "--plot", str(tmp_path / "a.png")],
             "--json and --plot name the same file"),
            (["--plot", str(tmp_path / "p.txt")], "end the file name with the image format"),
            (["--plot", str(tmp_path / "noext")], "end the file name with the image format")]:
        rc = main(["bench", "trace", "--model", NO_MODEL, "--trace", str(trace), *extra])
        err = capsys.readouterr().err
        assert rc == 2 and message in err and "Traceback" not in err, (extra, err)
    assert trace.read_text() == "{}\n"
    (tmp_path / "link.jsonl").hardlink_to(trace)  # one file under two names (paths.same_file)
    rc = main(["bench", "trace", "--model", NO_MODEL, "--trace", str(trace),
               "--json", str(tmp_path / "link.jsonl")])
    assert rc == 2 and "is the --trace file this run reads" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from bench_helpers import make_tiny_llama  # noqa: E402 - needs tests/ on sys.path

    return str(make_tiny_llama(tmp_path_factory.mktemp("args_model") / "model"))


@pytest.mark.parametrize("sub,extra,flags", [  # the tiny model's context is 2,048 tokens
    ("engine", ["--batch", "1", "--prompt-tokens", "2000", "--gen-tokens", "49",
                "--bandwidth-mib", "1"], "--prompt-tokens + --gen-tokens: 2049 tokens"),
    ("step", ["--batch", "1", "--prompt-tokens", "2030", "--steps", "11"],
     "--prompt-tokens + --steps + 8 spare tokens: 2049 tokens"),
    ("logits", ["--lengths", "7,2049"], "--lengths: 2049 tokens"),
    ("engine", ["--recent-window", "4096", "--bandwidth-mib", "1"], "--recent-window: 4096"),
])
def test_more_tokens_than_the_context_are_refused_before_the_load(tiny_model, sub, extra, flags,
                                                                  capsys):
    rc = main(["bench", sub, "--model", tiny_model, *extra])
    err = capsys.readouterr().err
    assert rc == 2 and flags in err and "context of 2048" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_trace_pool_larger_than_memory_is_refused_before_the_load(tiny_model, tmp_path, capsys):
    from bench_helpers import write_trace  # noqa: E402

    trace = write_trace(tmp_path / "t.jsonl", 1, 1)
    rc = main(["bench", "trace", "--model", tiny_model, "--trace", str(trace), "--systems", "edge",
               "--num-pages", str(10**12)])
    err = capsys.readouterr().err
    assert rc == 2 and "--num-pages 1000000000000" in err and "GiB" in err, err


def test_trace_request_larger_than_the_pool_is_one_line(tiny_model, tmp_path, capsys):
    from bench_helpers import write_trace  # noqa: E402

    trace = write_trace(tmp_path / "t.jsonl", 1, 1)
    rc = main(["bench", "trace", "--model", tiny_model, "--trace", str(trace), "--systems", "edge",
               "--num-pages", "1", "--page-tokens", "16", "--no-isolate"])
    err = capsys.readouterr().err
    assert rc == 2 and "refused request" in err and "--num-pages" in err, err
    assert "Traceback" not in err
