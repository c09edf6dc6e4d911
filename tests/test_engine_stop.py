"""StopChecker: stop strings never leak into streamed text, multi-byte characters are held back,
eos / stop ids / max_tokens finish with the right reason."""

from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.stop import StopChecker


class ByteTokenizer:
    """id = byte value, ids >= 256 special; decode like a byte-level BPE (invalid UTF-8 -> U+FFFD)."""

    def decode(self, ids, skip_special_tokens=False):
        if skip_special_tokens:
            return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        parts, run = [], []
        for i in list(ids) + [None]:
            if i is not None and i < 256:
                run.append(i)
                continue
            parts.append(bytes(run).decode("utf-8", errors="replace"))
            run = []
            if i is not None:
                parts.append(f"<|special{i}|>")
        return "".join(parts)

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


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="abé€😀 xy", max_size=30),
       stops=st.lists(st.text(alphabet="abxy€", min_size=1, max_size=3), max_size=3),
       max_tokens=st.integers(1, 60))
def test_streamed_text_never_shows_a_stop_string(text, stops, max_tokens):
    tok = ByteTokenizer()
    sc = StopChecker(tok, SamplingParams(max_tokens=max_tokens, stop=tuple(stops)), (EOS,))
    streamed, reason = "", None
    for i in tok.encode(text) + [EOS]:
        delta, reason = sc.append(i)
        streamed += delta
        if reason:
            break
    if reason is None:
        streamed += sc.finish_cancelled()
    assert streamed == sc.text
    assert not any(s in sc.text for s in stops)
    full = tok.decode(sc.token_ids)
    assert full.startswith(sc.text) or "\ufffd" in full
    assert sc.text == _reference(text, stops, max_tokens)


def _reference(text, stops, max_tokens):
    """Character by character: the first completed stop string cuts; max_tokens counts bytes
    (a length finish inside a multi-byte character ends the text with U+FFFD, like any decode)."""
    used = 0
    for n, ch in enumerate(text, 1):
        used += len(ch.encode())
        pre = text[:n]
        if used > max_tokens:  # the budget ends inside this character
            return pre[:-1] + "\ufffd"
        hits = [pre.find(s) for s in stops if s in pre]
        if hits:
            return pre[:min(hits)]
        if used == max_tokens:
            return pre
    return text


def test_special_tokens_are_not_answer_text():
    """A special id (not eos) inside the answer, and a second eos under ignore_eos, add no text:
    the service's answers match `generate`'s and other OpenAI servers'."""
    sc, streamed, reason = _run([97, 261, 98], SamplingParams(max_tokens=3))
    assert reason == "length" and sc.text == "ab" == streamed and sc.token_ids == [97, 261, 98]
    sc, streamed, _ = _run([97, EOS, 98], SamplingParams(max_tokens=3, ignore_eos=True))
    assert sc.text == "ab" == streamed
