"""Memory guard on a real engine with the real /proc/meminfo (+cgroup) source.

A helper process allocates memory until the guard's thresholds (set relative to the memory in
use when the test starts) are crossed; the guard must pause admission, go critical, return pool
memory to the OS (our RSS falls), then resume and regrow once the helper frees its memory, and
every request must still finish.
"""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest

from bench_helpers import make_tiny_llama
from edge_runtime.import_path import code_argv
from edge_runtime.engine.api import SamplingParams
from edge_runtime.guard_config import GuardConfig
from edge_runtime.guard.engine_hooks import EngineGuardHooks
from edge_runtime.guard.guard import MemoryGuard
from edge_runtime.guard.telemetry import ProcMeminfoSource

# machine-wide MemAvailable moves with every other process: a parallel test worker loading a model
# would hold the guard in its bands (make test runs this alone, after the parallel part)
pytestmark = pytest.mark.serial

MIB = 1 << 20
HOG = """
import sys
chunks = []
for _ in range({steps}):
    chunks.append(bytearray(b"x" * ({step_mib} << 20)))  # written, so resident
    print(len(chunks), flush=True)
    if sys.stdin.readline().strip() != "more":
        break
sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from edge_runtime.engine.backend import prepare_model, select_backend
    from edge_runtime.engine.config import EngineConfig
    from edge_runtime.engine.engine import Engine
    from edge_runtime.model.loader import load_model

    folder = make_tiny_llama(tmp_path_factory.mktemp("tiny"))
    loaded = load_model(str(folder))
    prepare_model(loaded.model, select_backend("cpu", "cpu"))
    # 1500 pages of this tiny model's int8 KV (~72 KiB each): ~105 MiB resident after the start-up touch
    return Engine(loaded, EngineConfig(num_pages=1500, max_num_seqs=4))


def _rss() -> int:
    return psutil.Process().memory_info().rss


def test_guard_with_proc_meminfo_and_a_memory_hog(engine):
    source = ProcMeminfoSource()
    sample = source.read()
    used0, total = sample.used_fraction, sample.total_bytes
    # bands a few hundred MiB above the start: wide enough for the machine's own drift while the
    # test runs alone, narrow enough that MemAvailable's gradual recovery after the hog (~30 MB/s
    # on the development VM) takes seconds, not a minute
    cfg = GuardConfig(high_used_fraction=used0 + 250 * MIB / total,
                      critical_used_fraction=used0 + 500 * MIB / total,
                      hysteresis=60 * MIB / total, preempt_on_critical=1,
                      shrink_chunks_on_critical=4,
                      # the episode may hold admission longer than the default bound; this test is
                      # about chunks and preemption (test_guard_admission covers the bound's 503s)
                      max_admission_pause_s=600.0)
    hooks = EngineGuardHooks(engine)
    guard = MemoryGuard(cfg, source, hooks)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    rids = [engine.add_request([5 + i, 6, 7, 8], params) for i in range(5)]
    results = {}

    def step():
        for ev in engine.step():
            if ev.result is not None:
                results[ev.request_id] = ev.result

    for _ in range(3):
        step()
    assert guard.poll() == "ok"

    hog = subprocess.Popen(code_argv(HOG.format(steps=30, step_mib=100)),
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    rss_before, rss_after = _rss(), None  # high returns chunks too: compare with the start
    try:
        seen = []
        while guard.state != "critical":
            assert hog.stdout.readline(), "the hog ran out of steps before critical"
            seen.append(guard.poll())
            step()
            hog.stdin.write("more\n")
            hog.stdin.flush()
        rss_after = _rss()
        assert "high" in seen or guard.transitions[("ok", "critical")] == 1
        assert not engine.admission_gate()  # admission paused under pressure
        assert guard.action_counts["chunks_released"] >= 1
        assert hooks.released_bytes > 50 * MIB
        assert rss_after < rss_before - 50 * MIB, (rss_before, rss_after)
    finally:
        hog.stdin.write("stop\nstop\n")
        hog.stdin.flush()
        hog.wait(30)
    # after the helper exits, the machine's MemAvailable recovers gradually, not at once: on the
    # development VM it climbed back ~30 MB/s, so returning below high minus
    # hysteresis can take over a minute there; the loop ends as soon as the guard is ok
    deadline = time.monotonic() + 180
    while guard.poll() != "ok":
        assert time.monotonic() < deadline, guard.snapshot()
        time.sleep(0.1)
    assert engine.admission_gate()
    # the guard regrows a chunk only once the reading with it resident stays below the high band,
    # one chunk at a time as the recovering MemAvailable allows: wait until every chunk is back
    while hooks.next_regrow_bytes():
        assert time.monotonic() < deadline, guard.snapshot()
        time.sleep(0.1)
        assert guard.poll() == "ok"
    assert guard.action_counts["chunks_regrown"] >= 1
    assert _rss() > rss_after + 50 * MIB  # the pool is resident again

    while engine.has_unfinished():
        step()
    assert sorted(results) == sorted(rids)  # no request lost
    assert all(r.finish_reason == "length" and len(r.token_ids) == 12 for r in results.values())
    assert guard.action_counts["preempted"] >= 1
    engine.kv.check_invariants()
