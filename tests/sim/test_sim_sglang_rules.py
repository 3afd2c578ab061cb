"""sglang 0.5.23's scheduling rules in the simulated engine, on small cases worked by hand from the source.

Every expected number below is computed in the comments from sglang's code (``schedule_policy.py``
PrefillAdder, ``prefill_budget.py``, ``scheduler.py`` update_running_batch, ``schedule_batch.py``
retract_decode, ``new_token_ratio_tracker.py``), not read off the simulator. Page size 1, KV in tokens.
A unit cost model: every iteration takes 1 s, so step i ends at t = i.
"""

from __future__ import annotations

import math

import pytest

from ebctl.protocol import BatchKind, Mode, Policy
from ebctl.sim.engine import Engine, EngineConfig
from ebctl.sim.rules import make_engine


class Unit:
    name = "unit"

    def step_time(self, batch):
        return 1.0


def _engine(**kw) -> Engine:
    base = {"max_running": 16, "token_budget": 4096, "kv_tokens": 1000}
    return make_engine(EngineConfig(**{**base, **kw}), Unit())


def _run(eng: Engine, steps: int) -> list:
    reps = []
    for _ in range(steps):
        rep = eng.step(float(len(reps)))
        reps.append(rep)
    return reps


def test_admission_reserves_each_requests_whole_output_with_ignore_eos():
    # check_prefill: prompt + max_new + page (100 + 300 + 1 = 401) < KV left after the reservations so far.
    # A: 401 < 1000 (reserved 401); B: 401 < 599 (reserved 802); C: 401 < 198 fails: NO_TOKEN, batch_is_full.
    eng = _engine()
    for _ in range(3):
        eng.add(100, 300, 0.0)
    reps = _run(eng, 301)
    assert (reps[0].kind, reps[0].prefill_reqs, reps[0].prefill_tokens) == (BatchKind.PREFILL, 2, 200)
    # batch_is_full is sticky: no prefill is tried until a request leaves. A and B make token 1 in the
    # prefill and 299 more in decode steps 2..300, leaving at step 300; step 301 admits C.
    assert all(r.kind is BatchKind.DECODE and r.decode_reqs == 2 for r in reps[1:300])
    assert reps[299].finished and len(reps[299].finished) == 2
    assert (reps[300].kind, reps[300].prefill_reqs) == (BatchKind.PREFILL, 1)
    assert eng.kv_refusals >= 1 and eng.preemptions == 0


def test_vllm_rules_admit_on_the_kv_used_now():
    # the same queue under vLLM's rules: 300 prompt tokens fit in 1,000 (block 1, watermark 1%): all three
    eng = _engine(rules="vllm", block_size=1)
    for _ in range(3):
        eng.add(100, 300, 0.0)
    assert eng.step(0.0).prefill_reqs == 3


@pytest.mark.parametrize(("conservativeness", "admitted"), [(1.0, 2), (2.0, 1)])
def test_running_requests_reserve_new_token_ratio_of_their_remaining_output(conservativeness, admitted):
    # Requests that stop on their own (max_new_tokens = 500 sent, EOS earlier): the running ones reserve
    # min(500 - output, 4096) × new_token_ratio, a new one its whole max_new_tokens (500).
    # Step 1 (nothing running): A, B, C each need 100 + 500 + 1 = 601 < 2200, 1599, 998; D: 601 < 397 fails.
    eng = _engine(kv_tokens=2200, max_new_tokens=500, schedule_conservativeness=conservativeness)
    eng.add(100, 5, 0.0)  # A leaves after step 5: token 1 in the prefill, 2..5 in decode steps 2..5
    for _ in range(2):
        eng.add(100, 50, 0.0)  # B, C
    for _ in range(3):
        eng.add(100, 50, 0.0)  # D, E, F wait
    reps = _run(eng, 6)
    assert reps[0].prefill_reqs == 3
    assert [r.kind for r in reps[1:5]] == [BatchKind.DECODE] * 4 and len(reps[4].finished) == 1
    # The ratio decayed in the 4 decode steps: init = min(0.7·c, 1), min = 0.14·init, step (init − min)/600.
    init = min(0.7 * conservativeness, 1.0)
    ratio = init - 4 * (init - 0.14 * init) / 600
    assert eng.new_token_ratio == pytest.approx(ratio, rel=1e-12)
    # Step 6: B and C hold 104 tokens each (prompt + 4 decoded) and reserve (500 − 5)·ratio each.
    # c = 1: ratio 0.695987, reserved 689.03; left 2200 − 208 − 689.03 = 1302.97: D (601) fits, then E
    #        601 < 701.97 fits, F 601 < 100.97 does not: 2 admitted.
    # c = 2: ratio 0.994267, reserved 984.32; left 1007.68: D fits, E 601 < 406.68 does not: 1 admitted.
    assert (reps[5].kind, reps[5].prefill_reqs) == (BatchKind.PREFILL, admitted)


def test_retraction_fewest_output_first_and_the_ratio_after_it():
    # KV 1,000, max_new_tokens 200 on every request. Step 1: A..D each need 10 + 200 + 1 = 211:
    # 211 < 1000, 789, 578, 367; E: 211 < 156 fails. A leaves after step 5 (4 decode steps, 4 decays).
    # Step 6: B, C, D hold 14 tokens each (42), reserve 3·195·0.695987 = 407.15; left 1000 − 42 − 407.15 =
    # 550.85: E (211) fits, F 211 < 339.85 fits, G 211 < 128.85 does not (batch_is_full again).
    eng = _engine(max_new_tokens=200)
    ids = {"A": eng.add(10, 5, 0.0)}
    for name in "BCDEFG":
        ids[name] = eng.add(10, 200, 0.0)
    reps = _run(eng, 6)
    assert reps[0].prefill_reqs == 4 and reps[5].prefill_reqs == 2
    # From step 7 the 5 rows decode; before step t KV holds 3·(14 + t − 7) + 2·(10 + t − 7) = 62 + 5(t − 7).
    # Step t needs 5 new tokens: it fits while 1000 − 62 − 5(t − 7) ≥ 5, i.e. through t = 193. Step 194 has
    # 3 free: retract. B, C, D have 5 + 187 = 192 outputs, E and F 1 + 187 = 188: fewest output first, and of
    # E and F the later in batch order, F. F frees its 10 + 187 = 197 tokens: 200 free ≥ 4 needed: done.
    reps += _run_from(eng, len(reps), 193 - 6)
    assert eng.retractions == 0
    rep = eng.step(193.0)
    assert eng.retractions == 1 and rep.kind is BatchKind.DECODE and rep.decode_reqs == 4
    assert list(eng.queue) == [ids["G"], ids["F"]]  # re-queued at the tail
    assert eng.req.generated[ids["F"]] == 188  # re-prefills prompt + 188 tokens on return
    # new_token_ratio after retraction: min(1, (Σ output + 20·n) / (Σ max_new + 1)) over B, C, D, E
    # = min(1, (3·192 + 188 + 80) / 801) = 1
    assert eng.new_token_ratio == 1.0


def _run_from(eng: Engine, start: int, steps: int) -> list:
    return [eng.step(float(start + i)) for i in range(steps)]


def test_one_chunked_request_then_the_next_takes_the_chunk_left():
    # --chunked-prefill-size 64: A (150 tokens) is cut to 64, 64, 22; in the step that ends A, the 42 tokens
    # left go to B (100 tokens), which becomes the chunked request (_select_prefill_admission).
    eng = _engine(token_budget=64)
    eng.add(150, 3, 0.0)
    eng.add(100, 3, 0.0)
    reps = _run(eng, 5)
    assert [(r.prefill_reqs, r.prefill_tokens) for r in reps[:5]] == [(1, 64), (1, 64), (2, 64), (1, 58), (0, 0)]
    assert reps[2].finished == () and eng.req.first_token[0] == 3.0  # A's first token with its last chunk


def test_mixed_chunk_gives_decode_rows_one_token_of_the_chunk_budget_each():
    # --enable-mixed-chunk: the PrefillAdder gets running_bs = 10 mixed decode tokens: the chunk budget
    # left for prompts is 64 − 10 = 54 (schedule_policy.py PrefillAdder.__init__).
    eng = _engine(token_budget=64, mixed_chunk=True)
    for _ in range(10):
        eng.add(5, 50, 0.0)
    first = eng.step(0.0)
    assert (first.prefill_reqs, first.prefill_tokens) == (10, 50)
    eng.add(200, 5, 1.0)
    rep = eng.step(1.0)
    assert rep.kind is BatchKind.MIXED and rep.decode_reqs == 10 and rep.prefill_tokens == 54


def test_eb_policy_gates_prefill_and_caps_running():
    # ebctl's plugin: eb mode turns mixing off, the gate holds prefills until k slots are free, n_max caps.
    eng = _engine(mixed_chunk=True)
    eng.policy = Policy(mode=Mode.EB, k=3, n_max=4, ttl_s=math.inf, max_defer_s=math.inf)
    for out in (2, 10, 10, 10, 10, 10):
        eng.add(5, out, 0.0)
    reps = _run(eng, 4)
    assert reps[0].prefill_reqs == 4  # nothing running: admit up to n_max
    # the first request leaves after step 2: 1 free slot < k = 3, so steps 3.. decode with 2 waiting
    assert reps[2].kind is BatchKind.DECODE and reps[2].waiting == 2 and reps[3].kind is BatchKind.DECODE
    assert all(r.running <= 4 for r in reps) and all(r.kind is not BatchKind.MIXED for r in reps)


def test_a_chunk_in_flight_goes_on_alone_while_the_gate_holds():
    # eb k = 4 on 4 slots, a 64-token chunk budget. Step 1 (nothing runs): A, B and 44 tokens of C's 200.
    # A (1 token out) leaves. Step 2: the queue is empty (the gate rests in DECODE), C goes on (64).
    # D and E arrive. Steps 3-4: 1 row runs, 3 free < k: the gate would hold, but a chunk is in flight:
    # it goes on alone (CHUNK_IN_FLIGHT, the plugin's allocatable 0): 64, then C's last 28 with 36 tokens of
    # budget left that D and E may not take. Step 5: no chunk, 2 free < k: held, a decode step.
    eng = _engine(token_budget=64)
    eng.policy = Policy(mode=Mode.EB, k=4, n_max=4, ttl_s=math.inf, max_defer_s=math.inf)
    for inp, out in ((10, 1), (10, 50), (200, 50)):
        eng.add(inp, out, 0.0)
    reps = _run(eng, 2)
    assert [(r.prefill_reqs, r.prefill_tokens) for r in reps] == [(3, 64), (1, 64)]
    for _ in range(2):
        eng.add(5, 50, 2.0)
    reps += _run_from(eng, 2, 3)
    assert [(r.prefill_reqs, r.prefill_tokens) for r in reps[2:4]] == [(1, 64), (1, 28)]
    assert reps[4].kind is BatchKind.DECODE and reps[4].waiting == 2
    # without a policy (stock sglang) the 36 tokens left in step 4 admit D and E
    stock = _engine(token_budget=64)
    for inp, out in ((10, 1), (10, 50), (200, 50)):
        stock.add(inp, out, 0.0)
    _run(stock, 2)
    for _ in range(2):
        stock.add(5, 50, 2.0)
    assert [r.prefill_reqs for r in _run_from(stock, 2, 2)] == [1, 3]


# --- sglang's own static knobs (no plugin policy) -----------------------------------------------------------

def test_min_free_slots_delay_holds_prefill_until_k_slots_are_allocatable():
    # 4 slots; A, B, C leave after 2 tokens (prefill step 0 makes token 1, decode step 1 token 2), D after 10
    # (step 9); four more wait. Step 2: 1 running, 3 allocatable. should_delay: running_bs > 0 and
    # allocatable < K. K = 3: 3 < 3 is false, the three are admitted. K = 4: delayed until D leaves at step 9;
    # step 10 has nothing running (never delayed) and admits 4. K = 1 is disabled (resolve_min_free_slots):
    # stock sglang, which admits at step 2 as K = 3 does; K = 2 would too (3 allocatable).
    def steps(**kw):
        eng = _engine(max_running=4, **kw)
        for out in (2, 2, 2, 10, 10, 10, 10, 10):
            eng.add(5, out, 0.0)
        return [(r.kind, r.prefill_reqs) for r in _run(eng, 11)]

    k3, k4 = steps(min_free_slots_delay=3), steps(min_free_slots_delay=4)
    assert k3[0] == k4[0] == (BatchKind.PREFILL, 4)
    assert k3[2] == (BatchKind.PREFILL, 3)
    assert all(s == (BatchKind.DECODE, 0) for s in k4[1:10]) and k4[10] == (BatchKind.PREFILL, 4)
    assert steps(min_free_slots_delay=1) == steps() == k3
    assert steps(min_free_slots_delay=99) == k4  # capped at max_running: 4


def test_min_free_slots_delay_lets_a_chunk_in_flight_go_on():
    # "Skipped during a chunked prefill". K = 3 of 4 slots, a 64-token chunk budget; R1, R2 (5 tokens) and A
    # (150) at t = 0. Step 0: nothing runs, all three admitted: 5 + 5 + A's first 54. After it R1, R2 run
    # (running_bs 2, allocatable 2 < 3): a fresh prefill would be delayed, but A is the chunk in flight and
    # goes on: 64 in step 1, its last 150 − 54 − 64 = 32 in step 2; step 3 decodes R1, R2 and A.
    eng = _engine(max_running=4, token_budget=64, min_free_slots_delay=3)
    for inp in (5, 5, 150):
        eng.add(inp, 50, 0.0)
    reps = _run(eng, 4)
    assert [(r.kind, r.prefill_reqs, r.prefill_tokens) for r in reps[:3]] == [
        (BatchKind.PREFILL, 3, 64), (BatchKind.PREFILL, 1, 64), (BatchKind.PREFILL, 1, 32)]
    assert reps[3].kind is BatchKind.DECODE and reps[3].decode_reqs == 3


def test_prefill_decode_interval_runs_n_decode_steps_after_each_prefill():
    # _arm_prefill_decode_interval: a prefill step arms N = 2; _should_defer_prefill then defers two rounds
    # (2 → 1 → 0) while the running batch holds ≥ min-bs requests. A is prefilled at step 0; B arrives at t = 1.
    def steps(**kw):
        eng = _engine(**kw)
        eng.add(5, 20, 0.0)
        reps = [eng.step(0.0)]
        eng.add(5, 20, 1.0)
        reps += _run_from(eng, 1, 4)
        return [(r.kind, r.prefill_reqs) for r in reps]

    P, D = BatchKind.PREFILL, BatchKind.DECODE
    assert steps(prefill_decode_interval=2) == [(P, 1), (D, 0), (D, 0), (P, 1), (D, 0)]
    assert steps() == [(P, 1), (P, 1), (D, 0), (D, 0), (D, 0)]  # stock: prefill first
    # min-bs 2: 1 request running < 2 disarms the interval at step 1 (prefill_decode_interval_remaining = 0)
    assert steps(prefill_decode_interval=2, prefill_decode_interval_min_bs=2) == steps()
    # under an ebctl policy the plugin asks sglang's own rule first (hooks.py defer_prefill): EB(k = 1), which
    # admits whenever a slot is free, still waits out the interval
    eng = _engine(prefill_decode_interval=2)
    eng.policy = Policy(mode=Mode.EB, k=1, n_max=16, ttl_s=math.inf, max_defer_s=math.inf)
    eng.add(5, 20, 0.0)
    reps = [eng.step(0.0)]
    eng.add(5, 20, 1.0)
    reps += _run_from(eng, 1, 4)
    assert [(r.kind, r.prefill_reqs) for r in reps] == [(P, 1), (D, 0), (D, 0), (P, 1), (D, 0)]


def test_a_policys_smaller_pd_interval_cuts_the_countdown_at_once():
    # As the plugin (sglang_patch/lifecycle.py set_pd_interval): A is prefilled under pd_interval 4, which arms 4
    # deferred rounds; B waits. After one decode round (3 left) the policy's interval drops to 1: the countdown
    # is cut to 1, so one more decode round, then B's prefill (step 3). Letting the old countdown run out would
    # have prefilled B at step 5.
    P, D = BatchKind.PREFILL, BatchKind.DECODE
    eng = _engine()
    eng.policy = Policy(mode=Mode.OFF, k=1, n_max=16, ttl_s=math.inf, max_defer_s=math.inf, pd_interval=4)
    eng.add(5, 20, 0.0)
    reps = [eng.step(0.0)]
    eng.add(5, 20, 0.5)
    reps.append(eng.step(1.0))
    eng.policy = Policy(mode=Mode.OFF, k=1, n_max=16, ttl_s=math.inf, max_defer_s=math.inf, pd_interval=1)
    reps += _run_from(eng, 2, 3)
    assert [(r.kind, r.prefill_reqs) for r in reps] == [(P, 1), (D, 0), (D, 0), (P, 1), (D, 0)]


def test_prefill_decode_interval_defers_a_chunk_in_flight_and_counts_a_mixed_step():
    # The interval is checked before get_new_batch_prefill, so a chunk in flight waits too. R (5 tokens, 50
    # out) runs; A (150 tokens) on a 64-token chunk budget, N = 1: chunk, decode, chunk, decode, last chunk.
    eng = _engine(token_budget=64, prefill_decode_interval=1)
    eng.add(5, 50, 0.0)
    reps = [eng.step(0.0)]
    eng.add(150, 5, 1.0)
    reps += _run_from(eng, 1, 6)
    assert [(r.kind, r.prefill_tokens) for r in reps[1:7]] == [
        (BatchKind.DECODE, 0), (BatchKind.PREFILL, 64), (BatchKind.DECODE, 0), (BatchKind.PREFILL, 64),
        (BatchKind.DECODE, 0), (BatchKind.PREFILL, 22)]
    # with --enable-mixed-chunk the chunks carry R's decode row (MIXED, an extend mode: it arms the interval)
    mixed = _engine(token_budget=64, prefill_decode_interval=1, mixed_chunk=True)
    mixed.add(5, 50, 0.0)
    out = [mixed.step(0.0)]
    mixed.add(150, 5, 1.0)
    out += _run_from(mixed, 1, 4)
    assert [r.kind for r in out[1:5]] == [BatchKind.DECODE, BatchKind.MIXED, BatchKind.DECODE, BatchKind.MIXED]


def test_prefill_decode_interval_with_nothing_running_does_not_wait():
    # With an empty running batch a deferred round is an idle loop iteration (microseconds): A finishes in its
    # prefill (1 token out), B arrives and is prefilled at the next step although N = 5 was armed.
    eng = _engine(prefill_decode_interval=5)
    eng.add(5, 1, 0.0)
    first = eng.step(0.0)
    assert first.finished
    eng.add(5, 3, 1.0)
    assert eng.step(1.0).prefill_reqs == 1


def test_each_requests_longest_gap_between_tokens():
    # Unit steps: A (10 tokens out) is prefilled in step 0 (token at t = 1), decodes at t = 2, 3. B (150 tokens)
    # arrives at t = 3; with no mixing its three chunks (64, 64, 22) run alone in steps 3-5 (B's first token at
    # t = 6), so A's next token comes at t = 7: A stalled 7 − 3 = 4 s. After that both decode every step
    # (B: t = 7..10, gaps of 1 s).
    eng = _engine(token_budget=64)
    eng.add(5, 10, 0.0)
    reps = _run(eng, 3)
    eng.add(150, 5, 3.0)
    reps += _run_from(eng, 3, 11)
    arr = eng.req.arrays()
    assert list(arr["finish"]) == [13.0, 10.0] and list(arr["max_gap"]) == [4.0, 1.0]
    # the reports' TPOT: (last token − first) / (output − 1): B (10 − 6) / 4, A (13 − 1) / 9
    assert [(f.output_len, f.tpot_s) for r in reps for f in r.finished] == [(5, 1.0), (10, pytest.approx(12 / 9))]
