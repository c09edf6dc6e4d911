"""StopChecker: stop strings never leak into streamed text, multi-byte characters are held back,
eos / stop ids / max_tokens finish with the right reason."""

from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.stop import StopChecker


class ByteTokenizer:
    """id = byte value; decode like a byte-level BPE (invalid UTF-8 -> U+FFFD)."""

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def encode(self, text):
        return list(text.encode("utf-8"))


EOS = 300


def _run(text_or_ids, params):
    tok = ByteTokenizer()
    ids = text_or_ids if isinstance(text_or_ids, list) else tok.encode(text_or_ids)
    sc = StopChecker(tok, params, (EOS,))
    deltas, reason = [], None
    for i in ids:
        d, reason = sc.append(i)
        deltas.append(d)
        if reason:
            break
    return sc, "".join(deltas), reason


def test_stop_string_truncates_and_never_streams():
    sc, streamed, reason = _run("hello wor" + "ld END more", SamplingParams(stop=("END", "xyz")))
    assert reason == "stop" and sc.text == "hello world " and streamed == sc.text
    assert len(sc.token_ids) == len("hello world END")


def test_multibyte_held_back_and_complete():
    text = "é€ ok 😀!"
    tok = ByteTokenizer()
    sc = StopChecker(tok, SamplingParams(max_tokens=100), (EOS,))
    parts = []
    for i in tok.encode(text):
        d, _ = sc.append(i)
        assert "\ufffd" not in d
        parts.append(d)
    d, reason = sc.append(EOS)
    parts.append(d)
    assert reason == "stop" and "".join(parts) == text == sc.text


def test_max_tokens_and_eos_and_stop_ids():
    sc, streamed, reason = _run("abcdefgh", SamplingParams(max_tokens=5))
    assert reason == "length" and sc.text == "abcde" == streamed
    sc, _, reason = _run([97, 98, EOS, 99], SamplingParams(max_tokens=10))
    assert reason == "stop" and sc.text == "ab" and sc.token_ids == [97, 98, EOS]
    sc, _, reason = _run([97, 98, EOS, 99], SamplingParams(max_tokens=4, ignore_eos=True))
    assert reason == "length" and sc.token_ids == [97, 98, EOS, 99]
    sc, _, reason = _run([97, 120, 98], SamplingParams(stop_token_ids=(120,)))
    assert reason == "stop" and sc.text == "a"


def test_length_finish_flushes_held_text_and_cancel():
    sc, streamed, reason = _run("abcdef", SamplingParams(max_tokens=6, stop=("zzzz",)))
    assert reason == "length" and streamed == "abcdef"
    tok = ByteTokenizer()
    sc = StopChecker(tok, SamplingParams(stop=("zzzz",)), (EOS,))
    out = "".join(sc.append(i)[0] for i in tok.encode("abcde"))
    out += sc.finish_cancelled()
    assert out == "abcde" and sc.finish_reason == "cancelled"
