"""Jump-forward (engine/emission.py) and forced-text drafts (engine/forced_drafts.py): a constrained
request's grammar-forced tokens, appended without a forward each (and its forced text drafted and
kept as far as the sampler confirms it), give exactly what decoding them one step each gives:
token ids, text, streamed events, finish reasons, seeded samples (n > 1), stop strings,
max_tokens cuts and preemptions, in fewer steps, and the logits after the same tokens are the
same (bit for bit alone: a rejected draft position must not disturb int8 KV's recent-key
window); on the tiny random model (fp32 and int8 KV), on the built-in SmolLM2 with the voice
loop's tool grammar, and on the CUDA back end (Triton interpreter). Requests that ask for
log-probs do not jump."""

from __future__ import annotations

import pytest
import torch

from backend_helpers import engine_on
from engine_helpers import engine_for, tiny, tiny_prompts
from model_helpers import random_ids, smollm2_gguf

from edge_runtime.engine.api import GrammarSpec, SamplingParams
from edge_runtime.engine.config import EngineConfig
from edge_runtime.engine.forced_drafts import accepted_count, build_draft
from edge_runtime.engine.grammar import allows, schema_text, single_allowed_token
from edge_runtime.errors import ConfigError
from edge_runtime.kernels import dispatch
from edge_runtime.voice.call_narrowing import narrow_functions
from edge_runtime.engine.placement import resolve
from edge_runtime.voice.command_set import COMMANDS, HOMES
from edge_runtime.voice.config import load_voice_config
from edge_runtime.voice.loop import action_params
from edge_runtime.voice.prompting import encode_text, load_system_prompt, render
from edge_runtime.voice.session import engine_config

SCHEMA = {
    "type": "object",
    "properties": {
        "device": {"enum": ["kitchen light", "hall light", "porch light"]},
        "on": {"type": "boolean"},
        "level": {"type": "integer", "minimum": 0, "maximum": 100},
        "room": {"type": "string", "maxLength": 12},
    },
    "required": ["device", "on", "level", "room"],
    "additionalProperties": False,
}
SPEC = GrammarSpec("json_schema", schema_text(SCHEMA))


def constrained(max_tokens: int = 48, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, grammar=SPEC, **kw)


def _tiny_engine(jump: bool, **cfg):
    cfg = dict(dict(kv_dtype="fp32", page_tokens=16, num_pages=60, max_num_seqs=8), **cfg)
    return engine_for(tiny(), jump_forward=jump, **cfg)


def run(engine, prompts, params) -> tuple[list, dict, int]:
    """(results, what was streamed per (request, choice): token ids and text, engine steps)."""
    params = params if isinstance(params, list) else [params] * len(prompts)
    rids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    streamed: dict[tuple[str, int], list] = {}
    results = {}
    while engine.has_unfinished():
        for ev in engine.step():
            got = streamed.setdefault((ev.request_id, ev.index), [[], ""])
            got[0] += ev.token_ids
            got[1] += ev.text
            if ev.result is not None:
                results[ev.request_id] = ev.result
    engine.kv.check_leaks()
    return [results[r] for r in rids], streamed, engine.counters["steps"]


def record_logits(engine) -> dict[tuple[int, ...], torch.Tensor]:
    """Every logits row the engine samples from, keyed by the tokens before it (a draft's rows
    by the real tokens and the draft tokens before the row)."""
    seen, emit = {}, engine._emitter.sample_and_emit

    def recording(sampled, logits, events, masks=None):
        for row, seq in sampled:
            draft = [] if seq.draft is None else seq.draft.token_ids
            for j in range(len(draft) + 1):
                seen[tuple(seq.token_ids + draft[:j])] = logits[row + j].clone()
        return emit(sampled, logits, events, masks)

    engine._emitter.sample_and_emit = recording
    return seen


def assert_same_logits(jumped: dict, plain: dict, atol: float = 0.0) -> None:
    """Where both computed the logits after the same tokens, they are the same: bit for bit when
    each request ran alone; within rounding (atol) when batched otherwise (the linears' float
    sums run over other batch shapes)."""
    common = [key for key in plain if key in jumped]
    assert len(common) > len(plain) // 2, (len(common), len(plain))
    for key in common:
        diff = float((jumped[key] - plain[key]).abs().max())
        assert diff <= atol, (len(key), diff)


def outputs(results) -> list:
    return [[(c.token_ids, c.text, c.finish_reason, c.logprobs) for c in r.completions]
            for r in results]


def assert_same_in_fewer_steps(prompts, params, jump_engine, plain_engine):
    """Both engines give the same outputs and streams; the jumping one takes fewer steps."""
    jumped, jumped_stream, jumped_steps = run(jump_engine, prompts, params)
    plain, plain_stream, plain_steps = run(plain_engine, prompts, params)
    assert outputs(jumped) == outputs(plain)
    assert list(jumped_stream.values()) == list(plain_stream.values())
    assert plain_engine.counters["forced_tokens"] == 0
    assert jump_engine.counters["forced_tokens"] > 0
    assert jumped_steps < plain_steps
    return jumped


def test_single_allowed_token_reads_one_set_bit_below_the_vocabulary():
    row = torch.zeros(4, dtype=torch.int32)
    assert single_allowed_token(row, 100) is None  # nothing allowed
    for token in (0, 5, 31, 32, 63, 99):
        row.zero_()
        row[token // 32] = torch.tensor(1 << (token % 32)).to(torch.int32)  # bit 31: negative
        assert single_allowed_token(row, 100) == token
    row[0] = 1 << 3  # a second token (99 is set too)
    assert single_allowed_token(row, 100) is None
    row.zero_()
    row[0] = (1 << 3) | (1 << 4)  # two bits in one word
    assert single_allowed_token(row, 100) is None
    row.zero_()
    row[3] = 1 << 8  # token 104: past a 100-token vocabulary
    assert single_allowed_token(row, 100) is None


def test_the_settings_are_bools():
    assert EngineConfig().jump_forward is True and EngineConfig().forced_text_drafts is True
    for name in ("jump_forward", "forced_text_drafts"):
        with pytest.raises(ConfigError, match=f"{name} must be true or false"):
            EngineConfig(**{name: "yes"})


def test_the_voice_config_setting_reaches_the_engine(tmp_path):
    (tmp_path / "voice.yaml").write_text("jump_forward: false\n")
    voice = load_voice_config(tmp_path / "voice.yaml")
    assert voice.jump_forward is False and load_voice_config().jump_forward is True
    placement = resolve("cpu", "cpu")
    for on in (True, False):
        assert engine_config(5, None, tiny(), placement, on).jump_forward is on


def test_a_draft_spells_the_forced_text_on_a_fork_with_each_rows_mask():
    engine = _tiny_engine(True)
    tokenizer = engine.tokenizer
    matcher = engine.constraints.compiler.matcher(engine.constraints.compile(constrained()))
    text = matcher.forced_text()
    assert text.startswith('{"device": "')
    draft = build_draft(matcher, lambda t: tokenizer.encode(t, add_special_tokens=False), 32)
    assert len(draft.masks) == len(draft.token_ids) + 1
    assert tokenizer.decode(draft.token_ids) == text  # then three devices: no single token
    for token, mask in zip(draft.token_ids, draft.masks):
        assert allows(mask, token)
    assert matcher.forced_text() == text  # the sequence's own matcher did not move
    for token in draft.token_ids:
        matcher.accept(token)
    assert torch.equal(matcher.next_mask(), draft.masks[-1])
    short = build_draft(engine.constraints.compiler.matcher(engine.constraints.compile(
        constrained())), lambda t: tokenizer.encode(t, add_special_tokens=False), 2)
    assert short.token_ids == draft.token_ids[:2] and draft.truncated(2).token_ids == short.token_ids
    assert all(torch.equal(a, b) for a, b in zip(draft.truncated(2).masks, short.masks))
    assert accepted_count([5, 6, 7], [5, 6, 9, 1]) == 2
    assert accepted_count([5, 6], [5, 6, 4]) == 2 and accepted_count([5], [4, 1]) == 0


@pytest.mark.parametrize("kv_dtype", ["fp32", "int8"])
def test_greedy_batch_with_plain_requests_and_a_shared_prefix_is_unchanged(kv_dtype):
    system = tiny_prompts([20], seed=811)[0]
    prompts = [system + p if i % 2 == 0 else p
               for i, p in enumerate(tiny_prompts([12, 30, 8, 21, 15, 9], seed=810))]
    params = [constrained() if i % 3 != 2 else SamplingParams(max_tokens=10, ignore_eos=True)
              for i in range(len(prompts))]
    jumping, plain = _tiny_engine(True, kv_dtype=kv_dtype), _tiny_engine(False, kv_dtype=kv_dtype)
    jumped_logits, plain_logits = record_logits(jumping), record_logits(plain)
    results = assert_same_in_fewer_steps(prompts, params, jumping, plain)
    assert any(r.finish_reason == "stop" for r, sp in zip(results, params) if sp.grammar)
    assert_same_logits(jumped_logits, plain_logits, atol=1e-4)


@pytest.mark.parametrize("page_tokens", [16, 64])
def test_int8_kv_with_recent_windows_and_rejected_drafts_is_unchanged(page_tokens):
    # 64-token pages: a draft could reach past its 16-position window block (it must not: the
    # block a chunk ends in is written to the window, over the block before)
    cfg = dict(kv_dtype="int8", page_tokens=page_tokens, num_pages=60 * 16 // page_tokens)
    jumping, plain = _tiny_engine(True, **cfg), _tiny_engine(False, **cfg)
    assert jumping.config.recent_window == 16
    jumped_logits, plain_logits = record_logits(jumping), record_logits(plain)
    assert_same_in_fewer_steps(tiny_prompts([5, 9, 13, 17, 23], seed=815), constrained(),
                               jumping, plain)
    counters = jumping.counters
    assert counters["draft_tokens"] > counters["draft_tokens_kept"] > 0  # guesses kept, rejected
    assert_same_logits(jumped_logits, plain_logits)  # the tokens could hide a wrong read


def test_without_drafts_only_single_forced_tokens_jump_and_nothing_changes():
    prompts = tiny_prompts([12, 8, 21], seed=812)
    singles = _tiny_engine(True, forced_text_drafts=False)
    assert_same_in_fewer_steps(prompts, constrained(), singles, _tiny_engine(False))
    assert singles.counters["draft_tokens"] == 0


def test_seeded_samples_n_gt_1_with_penalties_are_unchanged():
    params = [constrained(n=3, temperature=1.3, seed=5, top_k=50, top_p=0.9,
                          repetition_penalty=1.2, presence_penalty=0.5),
              constrained(temperature=0.8, seed=9)]
    results = assert_same_in_fewer_steps(tiny_prompts([10, 14], seed=820), params,
                                         _tiny_engine(True), _tiny_engine(False))
    assert len({c.text for c in results[0].completions}) > 1


def test_max_tokens_cuts_and_stop_strings_are_unchanged():
    prompt = tiny_prompts([9], seed=830)[0]
    params = [constrained(max_tokens=m) for m in (1, 2, 3, 5, 8, 13)]
    params += [constrained(stop=(s,)) for s in ('"on"', "true", "false", "light", '"}')]
    results = assert_same_in_fewer_steps([prompt] * len(params), params, _tiny_engine(True),
                                         _tiny_engine(False))
    assert {r.finish_reason for r in results} == {"length", "stop"}


def test_preempted_jumping_requests_recompute_and_are_unchanged():
    prompts = tiny_prompts([30, 35, 28, 33], seed=840)
    cfg = dict(page_tokens=16, num_pages=8, enable_inline=False, max_num_seqs=4,
               max_batch_tokens=200)
    jumping = _tiny_engine(True, **cfg)
    assert_same_in_fewer_steps(prompts, constrained(), jumping, _tiny_engine(False, **cfg))
    assert jumping.stats()["preemptions"] > 0


def test_a_small_step_budget_splits_the_forced_tokens_and_is_unchanged():
    prompts = tiny_prompts([6, 7, 5], seed=850)
    cfg = dict(max_num_seqs=3, max_batch_tokens=4)  # the forced run is computed over steps
    assert_same_in_fewer_steps(prompts, constrained(), _tiny_engine(True, **cfg),
                               _tiny_engine(False, **cfg))


def test_requests_asking_for_log_probs_do_not_jump():
    prompts = tiny_prompts([11, 13], seed=860)
    jumping, plain = _tiny_engine(True), _tiny_engine(False)
    jumped, _, _ = run(jumping, prompts, constrained(logprobs=2))
    assert jumping.counters["forced_tokens"] == 0
    assert outputs(jumped) == outputs(run(plain, prompts, constrained(logprobs=2))[0])
    assert all(len(c.logprobs) == len(c.token_ids) for r in jumped for c in r.completions)


def voice_calls(tokenizer, count: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """The first `count` typed commands of the command set with the voice loop's system prompt
    (examples in) and tool grammar (narrowed), as voice/loop.py asks for them."""
    prompts, params = [], []
    for command in COMMANDS[:count]:
        system = load_system_prompt(HOMES[command.home])
        functions = [a.function for a in system.actions]
        prompts.append(encode_text(tokenizer, render(tokenizer, [
            {"role": "system", "content": system.text},
            {"role": "user", "content": command.text}])))
        params.append(action_params(narrow_functions(functions, command.text), 48))
    return prompts, params


@pytest.mark.slow
def test_smollm2_voice_tool_calls_are_unchanged():
    loaded = smollm2_gguf()
    prompts, params = voice_calls(loaded.tokenizer, 6)

    def engine(jump):
        return engine_for(loaded, jump_forward=jump, num_pages=16, max_num_seqs=3,
                          check_invariants_every_step=False)

    jumping, plain = engine(True), engine(False)
    jumped_logits, plain_logits = record_logits(jumping), record_logits(plain)
    results = assert_same_in_fewer_steps(prompts, params, jumping, plain)
    assert all(r.finish_reason == "stop" for r in results), [r.text for r in results]
    assert jumping.counters["draft_tokens_kept"] > jumping.counters["draft_tokens"] // 2
    assert_same_logits(jumped_logits, plain_logits, atol=1e-3)


@pytest.mark.slow  # the interpreter: ~100 s
@pytest.mark.skipif(not dispatch.triton_importable(), reason="needs triton (interpreter)")
def test_cuda_back_end_jumps_to_the_cpu_back_ends_tokens():
    prompts = [random_ids(n, 500, seed=870 + n) for n in (7, 12)]
    params = [constrained(max_tokens=14), constrained(max_tokens=14, n=2, temperature=1.0, seed=3)]
    cpu_plain = run(engine_on("cpu", jump_forward=False), prompts, params)[0]
    cuda = engine_on("cuda", jump_forward=True)
    jumped = assert_same_in_fewer_steps(prompts, params, cuda, engine_on("cuda", jump_forward=False))
    assert outputs(jumped) == outputs(cpu_plain)
    assert cuda.counters["draft_tokens"] > cuda.counters["draft_tokens_kept"] > 0
