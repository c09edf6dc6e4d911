"""The Engine: requests in, one batched forward per `step()`, token events out (docs/interfaces.md).

One step = scheduler decision -> CopyOps on the tensors -> the step runner's forward over the
flattened varlen batch (engine/step_runner.py: the back end's KV context, or a decode graph)
-> commit written tokens to the KVManager -> the emitter (engine/emission.py) has the runner
sample, appends each token (grammar, stop checks) and the tokens its grammar forces after it
(jump-forward: computed next step as one chunk, like a prefill), forks the choices of an n > 1 request,
advances beam searches (engine/beam.py decides) and emits the events. Sequences are made, forked
and dropped, and requests ended, by engine/seq_lifecycle.py.

The back end is chosen once here from `EngineConfig.backend` and `.device`; the model must have
been prepared for it beforehand (`backend.prepare_model`, model preparation, not engine building).

Invariants:
- `add_request`, `cancel`, `step` and the memory-guard hooks take one lock, so they can be called
  from any thread; a guard hook called during a step waits for it to end (never acts inside one).
- Every request ends with exactly one event whose `.result` is set; no request is dropped
  (preempted ones resume; one that cannot fit even alone ends with finish_reason "error").
- When no work is left the KVManager's invariants are checked (leak check): a failure raises.
"""

from __future__ import annotations

import itertools
import threading
import time

from edge_runtime.engine import beam
from edge_runtime.engine.api import GenerationResult, SamplingParams, TokenEvent
from edge_runtime.engine.backend import check_prepared, select_backend
from edge_runtime.engine.config import EngineConfig, resolve_num_pages
from edge_runtime.engine.constraints import Constraints
from edge_runtime.engine.emission import Emitter
from edge_runtime.engine.snapshot import EngineSnapshot
from edge_runtime.kv.setup import build_kv
from edge_runtime.kv.paged_context import SeqStep
from edge_runtime.kv.pool_resize import PoolChunks
from edge_runtime.engine.request_limits import check_request
from edge_runtime.engine.scheduler import Scheduler
from edge_runtime.engine.scoring import Scorer
from edge_runtime.engine.seq_lifecycle import SeqLifecycle
from edge_runtime.engine.sequence import Request, Sequence, SeqStatus
from edge_runtime.engine.step_runner import StepRunner
from edge_runtime.errors import RequestError


class Engine:
    def __init__(self, loaded_model, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        self.loaded = loaded_model
        self.model = loaded_model.model
        self.backend = select_backend(self.config.backend, self.config.device)
        check_prepared(self.model, self.backend)
        self.tokenizer = loaded_model.tokenizer
        mc = self.model_config = loaded_model.config
        cfg = self.config
        self.num_pages = resolve_num_pages(cfg)
        self.storage, self.kv = build_kv(loaded_model, cfg, self.num_pages,
                                         self.backend.pool_in_chunks)
        # the pool's ids: slices with layer groups (kv/layer_groups.py), else pages
        self.pool_chunks = PoolChunks(self.kv.pool.num_pages)
        self.scheduler = Scheduler(self.kv, cfg.max_num_seqs, cfg.max_batch_tokens,
                                   admission_gate=self.admission_gate)
        self.constraints = Constraints(self.tokenizer, mc.vocab_size, tuple(mc.eos_token_ids))
        self.runner = StepRunner(loaded_model, self.backend, self.storage, cfg)
        self.requests: dict[str, Request] = {}
        self._arrival = itertools.count()
        self._lock = threading.RLock()
        self._events: list[TokenEvent] = []  # produced outside step() (cancel)
        self._admission_paused = False
        self._broken: BaseException | None = None  # a step failed after committing ahead
        self.last_step_tokens = 0  # tokens computed by the last step (0: nothing could run)
        # prefill_tokens / decode_tokens: tokens computed at prompt / generated positions (a
        # jump-forward extend computes several generated ones in a step); forced_tokens: tokens
        # appended by jump-forward (engine/emission.py); draft_tokens / draft_tokens_kept: forced
        # text drafts computed / confirmed by the sampler (engine/forced_drafts.py)
        self.counters = dict(steps=0, prefill_tokens=0, decode_tokens=0, forced_tokens=0,
                             draft_tokens=0, draft_tokens_kept=0, requests_finished=0,
                             requests_failed=0, requests_cancelled=0, requests_refused=0,
                             pool_bytes_released=0)
        self._lifecycle = SeqLifecycle(self.kv, self.storage, self.scheduler, self.constraints,
                                       self.tokenizer, mc.eos_token_ids, self._arrival,
                                       self.requests, self.counters)
        self._emitter = Emitter(self.runner, self.constraints, self._lifecycle, self.tokenizer,
                                mc.max_position_embeddings, self.counters, cfg.jump_forward,
                                cfg.forced_text_drafts and cfg.jump_forward,
                                cfg.recent_window if cfg.kv_dtype == "int8" else 0)

    # --- public API -------------------------------------------------------------------------
    @property
    def lock(self):
        """The lock `add_request`, `cancel`, `step` and the memory-guard hooks hold: hold it to
        use `kv` and `storage` directly between steps."""
        return self._lock

    def scorer(self) -> Scorer:
        """Per-token scoring over this engine's KV cache and step runner, between its steps
        (engine/scoring.py)."""
        return Scorer(self.kv, self.storage, self.runner, self._lock, self.config.max_batch_tokens)

    def add_request(self, prompt_ids: list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, stream_id: str | None = None,
                    priority: int = 0) -> str:
        params = params or SamplingParams()
        prompt_ids = [int(t) for t in prompt_ids]
        self.validate_request(prompt_ids, params)
        grammar = self.constraints.compile(params)  # may raise; outside the lock (a compile is ms)
        with self._lock:
            rid = request_id or f"req-{next(self._arrival)}"
            if rid in self.requests:
                raise RequestError(f"request id {rid!r} is already in use; pick another")
            req = Request(rid, prompt_ids, params, stream_id, priority=int(priority))
            req.compiled_grammar = grammar
            # may raise: store nothing before
            first = self._lifecycle.new_seq(req, 0, list(prompt_ids))
            self.requests[rid] = req
            if req.is_beam:
                beam.start(req, self.model_config.eos_token_ids)
            self.scheduler.add(first)
            return rid

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self.scheduler.has_work() or self._events)

    def cancel(self, request_id: str) -> None:
        with self._lock:
            req = self.requests.get(request_id)
            if req is None or req.result is not None:
                return
            comps = (beam.cut_short_completions(req, self.tokenizer, "cancelled") if req.is_beam
                     else None)
            for seq in req.seqs:
                if seq.status is SeqStatus.FINISHED:
                    continue
                self._lifecycle.drop_seq(seq, cached=False)
                delta = seq.stop.finish_cancelled()
                self._events.append(TokenEvent(request_id, seq.index, [], delta))
            self.counters["requests_cancelled"] += 1
            self._lifecycle.finish_request(req, self._events, completions=comps)

    def step(self) -> list[TokenEvent]:
        with self._lock:
            if self._broken is not None:
                raise RuntimeError("an earlier step failed after its prefill tokens were committed "
                                   "ahead; their pages may be unwritten: build a new Engine") \
                    from self._broken
            events, self._events = self._events, []
            out = self.scheduler.schedule()
            for seq, message in out.failed:
                self._lifecycle.fail_seq(seq, message, events)
            # a failed request's other sequences (n > 1) may have been scheduled: drop them
            out.scheduled = [(s, n) for s, n in out.scheduled if s.status is SeqStatus.RUNNING]
            for _, op in out.copies:
                self.storage.copy(op)
            self.last_step_tokens = out.num_tokens
            if out.scheduled:
                try:
                    self._run_batch(out.scheduled, events, out.committed)
                except BaseException as exc:
                    # without tokens committed ahead a failed step can simply be retried; with
                    # them the prefix cache would hand out pages whose K/V was never written
                    if out.committed:
                        self._broken = exc
                    raise
                self.counters["steps"] += 1
            if not self.scheduler.has_work():
                self.kv.check_leaks()  # idle: no live page, no slot in use
            elif self.config.check_invariants_every_step:
                self.kv.check_invariants()
            return events

    def generate(self, prompts: list[list[int]], params=None) -> list[GenerationResult]:
        plist = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        assert len(plist) == len(prompts), (len(plist), len(prompts))
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        results: dict[str, GenerationResult] = {}
        while len(results) < len(ids):
            for ev in self.step():
                if ev.result is not None:
                    results[ev.request_id] = ev.result
        return [results[r] for r in ids]

    def stats(self) -> dict:
        with self._lock:
            return dict(self.counters, preemptions=self.scheduler.num_preemptions,
                        running=len(self.scheduler.running), waiting=len(self.scheduler.waiting),
                        kv_dtype=self.config.kv_dtype, page_tokens=self.config.page_tokens,
                        num_pages=self.num_pages, kv_bytes=self.storage.nbytes(),
                        backends=self.backend.describe(), kv=self.kv.stats(),
                        decode_graphs=None if self.runner.graphs is None else self.runner.graphs.stats(),
                        **self.constraints.stats())

    def snapshot(self) -> EngineSnapshot:
        """What the service and the guard read of the engine, at one moment (engine/snapshot.py)."""
        with self._lock:
            return EngineSnapshot(
                running_request_ids=frozenset(s.request.request_id for s in self.scheduler.running),
                held_request_ids=frozenset(self.requests),
                pool_bytes=self.storage.pool.nbytes(), num_pages=self.kv.pool.num_pages,
                next_regrow_pages=self.pool_chunks.next_regrow_pages(),
                pool_bytes_released=self.counters["pool_bytes_released"])

    # --- memory-guard hooks (docs/interfaces.md) --------------------------------------------
    def admission_gate(self) -> bool:
        return not self._admission_paused

    def set_admission_paused(self, paused: bool) -> None:
        self._admission_paused = bool(paused)

    def preempt_newest(self, k: int) -> int:
        with self._lock:
            return len(self.scheduler.preempt_newest(k))

    def evict_cached(self, max_pages: int | None = None) -> int:
        with self._lock:
            return self.kv.evict(max_pages)

    def shrink_pool(self, n_chunks: int) -> int:
        """Return up to n_chunks whole pool chunks to the OS (kv/pool_resize.py)."""
        with self._lock:
            done, released = self.pool_chunks.shrink(self.kv, self.storage, n_chunks)
            self.counters["pool_bytes_released"] += released
            return done

    def grow_pool(self, n_chunks: int | None = None) -> int:
        """Bring up to n_chunks (None: every) returned chunks back into service, toward the
        budgeted pool size."""
        with self._lock:
            return self.pool_chunks.grow(self.kv, self.storage, n_chunks)

    def refuse_waiting(self, message: str) -> int:
        """End every request that is still waiting for its first admission with `message` as its
        error (the admission pause ran out); admitted requests, preempted ones too, go on."""
        with self._lock:
            waiting = {s.request.request_id: s for s in self.scheduler.waiting
                       if s.request.first_scheduled_at is None}
            for seq in waiting.values():
                self._lifecycle.fail_seq(seq, message, self._events)
            self.counters["requests_refused"] += len(waiting)
            return len(waiting)

    # --- one step ---------------------------------------------------------------------------
    def _run_batch(self, scheduled: list[tuple[Sequence, int]], events: list[TokenEvent],
                   committed: set = frozenset()) -> None:
        """committed: seq_ids whose tokens the scheduler committed ahead (scheduler policy 5)."""
        now = time.perf_counter()
        ids, steps, last_rows, sampled = [], [], [], []
        for seq, n in scheduled:
            if seq.request.first_scheduled_at is None:
                seq.request.first_scheduled_at = now
            start = seq.num_computed
            real = min(n, len(seq.token_ids) - start)  # the rest: the draft (forced_drafts.py)
            draft = seq.draft.token_ids if n > real else []
            assert real + len(draft) == n, (seq.seq_id, n, real, seq.num_draft)
            ids += seq.token_ids[start:start + real] + draft
            steps.append(SeqStep.from_segments(self.kv.segments(seq.seq_id), start, n))
            if start + real == len(seq.token_ids):
                if not draft:
                    seq.draft = None  # not scheduled this step: sampled as usual
                sampled.append((len(last_rows), seq))  # its rows: one, or one per draft token + 1
                last_rows += range(len(ids) - len(draft) - 1, len(ids))
            prompt_part = max(0, min(n, seq.num_prompt - start))
            self.counters["prefill_tokens"] += prompt_part
            self.counters["decode_tokens"] += n - prompt_part
            self.counters["draft_tokens"] += len(draft)
        masks = self.constraints.start_masks(sampled)  # filled while the forward runs
        logits = self.runner.forward(ids, steps, last_rows)
        for seq, n in scheduled:
            start = seq.num_computed
            real = min(n, len(seq.token_ids) - start)  # a draft is committed as it is kept
            if seq.seq_id not in committed:
                self.kv.commit(seq.seq_id, seq.token_ids[start:start + real])
            seq.num_computed += real
        self._emitter.sample_and_emit(sampled, logits, events, masks)

    # --- requests --------------------------------------------------------------------------
    def validate_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """RequestError for a request this engine can never run (request_limits.py). add_request
        checks it; AsyncEngine too, before the request is queued for the loop thread."""
        check_request(prompt_ids, self.model_config, self.num_pages * self.config.page_tokens)
