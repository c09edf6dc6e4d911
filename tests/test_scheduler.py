"""Scheduler white-box scenarios on the real KVManager (no model): decode before prefill, token
budget and chunked prefill, FIFO admission that never skips ahead, max_num_seqs, preemption of
the newest with resume from the cache, admission gate, a request that can never fit."""

import itertools

from edge_runtime.kv.manager import KVManager
from edge_runtime.kv.seq_kv import PAGES, CopyOp
from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.scheduler import Scheduler
from edge_runtime.engine.sequence import Request, Sequence, SeqStatus

_arrival = itertools.count()


def _seq(name, n_prompt, max_tokens=8, first_token=3):
    prompt = list(range(first_token, first_token + n_prompt))
    req = Request(name, prompt, SamplingParams(max_tokens=max_tokens))
    seq = Sequence(f"{name}/0", req, 0, list(prompt), next(_arrival), None, None)
    req.seqs.append(seq)
    return seq


def _run(sched, out, sampled=7):
    """What the engine does after the forward: commit (unless the scheduler committed ahead),
    then append a token when caught up."""
    for seq, n in out.scheduled:
        if seq.seq_id not in out.committed:
            sched.kv.commit(seq.seq_id, seq.token_ids[seq.num_computed:seq.num_computed + n])
        seq.num_computed += n
        if seq.num_computed == len(seq.token_ids):
            seq.token_ids.append(sampled)


def test_decode_first_then_chunked_prefill_within_budget():
    kv = KVManager(num_pages=16, page_tokens=8)
    s = Scheduler(kv, max_num_seqs=4, max_batch_tokens=10)
    a, b = _seq("a", 5), _seq("b", 23, first_token=100)
    s.add(a)
    out = s.schedule()
    assert [(q.seq_id, n) for q, n in out.scheduled] == [("a/0", 5)]
    _run(s, out)
    s.add(b)
    out = s.schedule()  # a decodes (1), b gets the other 9 tokens of the budget
    assert [(q.seq_id, n) for q, n in out.scheduled] == [("a/0", 1), ("b/0", 9)]
    _run(s, out)
    out = s.schedule()
    assert [(q.seq_id, n) for q, n in out.scheduled] == [("a/0", 1), ("b/0", 9)]
    _run(s, out)
    out = s.schedule()
    assert [(q.seq_id, n) for q, n in out.scheduled] == [("a/0", 1), ("b/0", 5)]
    kv.check_invariants()


def test_fifo_admission_max_seqs_and_gate():
    kv = KVManager(num_pages=16, page_tokens=8)
    gate = {"open": False}
    s = Scheduler(kv, max_num_seqs=2, max_batch_tokens=64, admission_gate=lambda: gate["open"])
    seqs = [_seq(f"r{i}", 4, first_token=10 * i + 3) for i in range(3)]
    for q in seqs:
        s.add(q)
    assert s.schedule().scheduled == []  # the memory guard holds admission
    gate["open"] = True
    out = s.schedule()
    assert [q.seq_id for q, _ in out.scheduled] == ["r0/0", "r1/0"]  # max_num_seqs = 2
    assert list(s.waiting) == [seqs[2]]


def test_preempts_newest_and_resumes_from_cache():
    kv = KVManager(num_pages=4, page_tokens=4)
    s = Scheduler(kv, max_num_seqs=4, max_batch_tokens=64)
    old, new = _seq("old", 7), _seq("new", 7, first_token=50)
    s.add(old)
    s.add(new)
    _run(s, s.schedule())  # both prefilled: 2 pages each, pool full
    out = s.schedule()  # both decode into position 7: still room (page holds 4)
    _run(s, out)
    out = s.schedule()  # position 8 needs a new page each: the newest goes
    assert [q.seq_id for q in out.preempted] == ["new/0"]
    assert [q.seq_id for q, _ in out.scheduled] == ["old/0"]
    assert new.status is SeqStatus.WAITING and s.waiting[0] is new and new.num_computed == 0
    assert s.num_preemptions == 1
    kv.check_invariants()
    s.remove(old)
    kv.release(old.seq_id)
    out = s.schedule()  # resumed: its full page is still cached, only the rest is recomputed
    (seq, n), = out.scheduled
    assert seq is new and new.num_computed >= 4 and n == len(new.token_ids) - new.num_computed


def test_request_that_never_fits_fails_instead_of_waiting_forever():
    kv = KVManager(num_pages=2, page_tokens=4)
    s = Scheduler(kv, max_num_seqs=2, max_batch_tokens=64)
    big = _seq("big", 12)
    s.add(big)
    out = s.schedule()
    assert [(q.seq_id, "KV pool" in msg) for q, msg in out.failed] == [("big/0", True)]
    assert not s.has_work()
    kv.check_leaks()


def test_lowest_priority_is_preempted_before_the_newest():
    kv = KVManager(num_pages=4, page_tokens=4)
    s = Scheduler(kv, max_num_seqs=4, max_batch_tokens=64)
    low, high = _seq("low", 7), _seq("high", 7, first_token=50)
    low.request.priority, high.request.priority = -1, 5  # the older one matters less
    s.add(low)
    s.add(high)
    _run(s, s.schedule())
    _run(s, s.schedule())
    out = s.schedule()  # both need a new page: the low-priority (older) one goes
    assert [q.seq_id for q in out.preempted] == ["low/0"]
    assert [q.seq_id for q, _ in out.scheduled] == ["high/0"]


def _sharing_pair(shared=40, extra=6):
    """a: `shared` tokens; b: the same tokens followed by `extra` of its own."""
    a = _seq("a", shared)
    b = _seq("b", shared)
    b.token_ids += list(range(900, 900 + extra))
    b.request.prompt_ids = list(b.token_ids)
    return a, b


def test_arriving_together_one_prefix_is_computed_once_in_one_step():
    kv = KVManager(num_pages=16, page_tokens=8)
    s = Scheduler(kv, max_num_seqs=4, max_batch_tokens=64)
    a, b = _sharing_pair()
    s.add(a)
    s.add(b)
    out = s.schedule()
    # a computes the 40 shared tokens; b reads a's pages in the same forward, computes its 6
    assert [(q.seq_id, n) for q, n in out.scheduled] == [("a/0", 40), ("b/0", 6)]
    assert out.committed == {"a/0"} and out.copies == []
    assert b.num_computed == 40 and kv.seqs["b/0"].prefix_pages == kv.seqs["a/0"].tail_pages
    assert kv.counters.cached_prompt_tokens == 40
    kv.check_invariants()
    _run(s, out)
    kv.check_invariants()
    assert [(q.seq_id, n) for q, n in s.schedule().scheduled] == [("a/0", 1), ("b/0", 1)]


def test_prefill_longer_than_the_step_still_makes_the_other_wait():
    kv = KVManager(num_pages=16, page_tokens=8)
    s = Scheduler(kv, max_num_seqs=4, max_batch_tokens=48)
    a, b = _sharing_pair(shared=80)
    s.add(a)
    s.add(b)
    out = s.schedule()  # a's first chunk takes the whole budget: b waits for the rest
    assert [(q.seq_id, n) for q, n in out.scheduled] == [("a/0", 48)]
    assert out.committed == set() and list(s.waiting) == [b]
    _run(s, out)
    out = s.schedule()  # a's last 32 tokens, then b in the same step over all 80 of them
    assert [(q.seq_id, n) for q, n in out.scheduled] == [("a/0", 32), ("b/0", 6)]
    assert out.committed == {"a/0"} and b.num_computed == 80
    _run(s, out)
    kv.check_invariants()


def test_a_sharer_that_needs_a_copy_waits_and_leaves_the_counters(monkeypatch):
    """A copy runs before the forward, when the pages committed ahead are not written yet: such
    a sequence is taken back and admitted in the next step instead."""
    kv = KVManager(num_pages=16, page_tokens=8)
    s = Scheduler(kv, max_num_seqs=4, max_batch_tokens=64)
    a, b = _sharing_pair()
    s.add(a)
    s.add(b)
    reserve = kv.reserve

    def reserve_with_a_copy(seq_id, n):
        ops = reserve(seq_id, n)
        if seq_id == "b/0":
            ops = ops + [kv.tail_allocator.count_copy(CopyOp(PAGES, 0, PAGES, 8, 4))]
        return ops

    monkeypatch.setattr(kv, "reserve", reserve_with_a_copy)
    out = s.schedule()
    assert [(q.seq_id, n) for q, n in out.scheduled] == [("a/0", 40)]
    assert list(s.waiting) == [b] and b.num_computed == 0 and "b/0" not in kv.seqs
    c = kv.counters
    assert (c.admitted, c.copies, c.copied_tokens, c.cached_prompt_tokens) == (1, 0, 0, 0)
    kv.check_invariants()
