"""Cost profiles: the schema-2 file round-trips, schema-1 files still load, errors name file, key and value."""

import json
import math

import numpy as np
import pytest

from ebctl import profiles
from ebctl.costfit import OnlineCosts
from ebctl.costmodel import IterationCosts, PhaseCost
from ebctl.model import Costs
from ebctl.profiles import Profile, ProfileError
from ebctl.protocol import BatchKind, IterationReport

D, P = BatchKind.DECODE, BatchKind.PREFILL


def calibrated() -> Profile:
    """What ``ebctl tune calibrate`` builds (daemon/control.py): fits of a simulated engine."""
    rng = np.random.default_rng(0)
    oc = OnlineCosts()
    for _ in range(200):
        tok = int(rng.integers(10, 500))
        oc.observe(IterationReport(engine_id="e", seq=0, wall_time=0.0, kind=P, prefill_tokens=tok, prefill_reqs=1,
                                   forward_s=(1e-3 + 2e-5 * tok) * rng.lognormal(0, 0.02)))
        n = int(rng.integers(1, 16))
        for _ in range(5):
            oc.observe(IterationReport(engine_id="e", seq=0, wall_time=0.0, kind=D, decode_reqs=n,
                                       decode_ctx_tokens=n * 100, forward_s=(4e-3 + 1e-4 * n) * rng.lognormal(0, 0.02)))
    oc.refit(force=True)
    choice = oc.choose(Costs(1.0, 1.0, 1.0, 1.0), "default", needs_mixed=False)
    assert choice.source == "online"
    return Profile(name="tiny/cpu", model="tiny", gpu="none", costs=choice.costs, source="test",
                   iteration_costs=oc.iteration_costs(), fit=oc.fit_report(), sim={"layers": 2, "note": [1, 2]})


def write(tmp_path, doc, name="p.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def test_calibrated_profile_round_trips(tmp_path):
    prof = calibrated()
    path = write(tmp_path, prof.to_json())
    back = profiles.load(path)
    assert back == prof and back.to_dict() == prof.to_dict() and back.path == path
    assert back.iteration_costs.decode.intercept_s == prof.iteration_costs.decode.intercept_s > 0
    assert back.sim == {"layers": 2, "note": [1, 2]} and back.fit["decode"]["ok"] is True
    assert not back.costs.has_mixed  # c0 null in the file: unknown, as before
    doc = json.loads(prof.to_json())
    assert doc["schema"] == 2 and doc["costs"]["c0"] is None and doc["iteration_costs"]["mixed"] is None


def test_presets_still_load_and_round_trip(tmp_path):
    presets = profiles.builtin()
    assert {"qwen3-8b/h200", "qwen3-8b/rtx-pro-6000"} <= set(presets)
    p = profiles.load("Qwen3-8B/H200")
    assert p.costs.alpha_d == pytest.approx(8.92e-3, rel=1e-3) and p.decode_attention_ms and p.costs.has_mixed
    assert p.fit["prefill"]["r2"] == pytest.approx(0.9968) and p.iteration_costs is None
    assert profiles.load(write(tmp_path, p.to_json())) == p


def test_schema_1_files_still_load(tmp_path):
    old = {"name": "old", "model": "m", "gpu": "g", "source": "ebctl calibrate: ...",
           "costs": {"alpha_p": 1e-3, "beta_p": 2e-5, "alpha_d": 9e-3, "beta_d": 4e-5, "alpha_mb": 0.0,
                     "c0": None, "c1": 0.0, "c2": 0.0},
           "decode_attention_ms": [[128, 0.1], [512, 0.3]],
           "fit": {"prefill": {"r2": 0.99, "n": 100, "used": True}}}
    p = profiles.load(write(tmp_path, old))
    assert p.costs == Costs(alpha_p=1e-3, beta_p=2e-5, alpha_d=9e-3, beta_d=4e-5)
    assert p.decode_attention_ms == ((128, 0.1), (512, 0.3)) and p.fit == old["fit"] and p.iteration_costs is None
    nameless = profiles.load(write(tmp_path, {"costs": old["costs"]}, name="mine.json"))
    assert nameless.name == "mine"


@pytest.mark.parametrize(("doc", "needle"), [
    ({"schema": 3, "costs": {}}, "schema=3"),
    ({"schema": 2, "costs": {"alpha_p": 0, "beta_p": 0, "alpha_d": 1, "beta_d": 0}, "extra": 1},
     "unknown key 'extra' for schema 2"),
    ({"costs": {"alpha_p": 0, "beta_p": 0, "alpha_d": 1, "beta_d": 0}, "sim": {}}, "unknown key 'sim' for schema 1"),
    ({"schema": 2}, "costs=None"),
    ({"schema": 2, "costs": {"alpha_p": 0, "beta_p": 0, "alpha_d": 1}}, "costs.beta_d is missing"),
    ({"schema": 2, "costs": {"alpha_p": 0, "beta_p": -1, "alpha_d": 1, "beta_d": 0}}, "costs.beta_p=-1"),
    ({"schema": 2, "costs": {"alpha_p": 0, "beta_p": 0, "alpha_d": 0, "beta_d": 0}}, "costs.alpha_d=0: must be > 0"),
    ({"schema": 2, "costs": {"alpha_p": "1", "beta_p": 0, "alpha_d": 1, "beta_d": 0}}, "costs.alpha_p='1'"),
    ({"schema": 2, "costs": {"alpha_p": 0, "beta_p": 0, "alpha_d": 1, "beta_d": 0, "gamma": 1}}, "costs.gamma"),
    ({"schema": 2, "costs": {"alpha_p": 0, "beta_p": 0, "alpha_d": 1, "beta_d": 0},
      "iteration_costs": {"decode": {"intercept_s": "x"}}}, "iteration_costs: Expected `float`, got `str` - at "
                                                           "`$.decode.intercept_s`"),
    ({"schema": 2, "costs": {"alpha_p": 0, "beta_p": 0, "alpha_d": 1, "beta_d": 0},
      "iteration_costs": {"decode": {"intercept_s": -1.0}}}, "iteration_costs.decode.intercept_s=-1.0"),
    ({"schema": 2, "costs": {"alpha_p": 0, "beta_p": 0, "alpha_d": 1, "beta_d": 0},
      "iteration_costs": {"decode": {"slope": 1.0}}}, "unknown field `slope`"),
    ({"schema": 2, "name": 5, "costs": {"alpha_p": 0, "beta_p": 0, "alpha_d": 1, "beta_d": 0}}, "name=5"),
    ({"schema": 2, "costs": {"alpha_p": 0, "beta_p": 0, "alpha_d": 1, "beta_d": 0}, "fit": [1]}, "fit=[1]"),
    ({"schema": 2, "costs": {"alpha_p": 0, "beta_p": 0, "alpha_d": 1, "beta_d": 0},
      "decode_attention_ms": [[1]]}, "decode_attention_ms=[[1]]"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_files_are_refused_naming_file_key_and_value(tmp_path, doc, needle):
    path = write(tmp_path, doc)
    with pytest.raises(ProfileError) as e:
        profiles.load(path)
    assert str(e.value).startswith(f"profile file {path}: ") and needle in str(e.value), str(e.value)


def test_missing_and_unreadable(tmp_path):
    with pytest.raises(ProfileError, match=r"no such preset .*qwen3-8b/h200.* and no such file"):
        profiles.load(str(tmp_path / "none.json"))
    with pytest.raises(ProfileError, match=r"profile file .*bad\.json: Expecting property name"):
        profiles.load(write(tmp_path, "{nope", name="bad.json"))


def test_iteration_costs_predict_from_a_loaded_file(tmp_path):
    """What the simulator reads: a profile's iteration_costs price an iteration (hand-worked)."""
    ic = IterationCosts(decode=PhaseCost(intercept_s=4e-3, decode_req_s=1e-4, decode_ctx_token_s=1e-7))
    prof = Profile(name="x", model="", gpu="", costs=Costs(0.0, 0.0, 4e-3, 1e-4), iteration_costs=ic)
    back = profiles.load(write(tmp_path, prof.to_json()))
    assert back.iteration_costs.predict(D, decode_reqs=10, decode_ctx_tokens=2000) == pytest.approx(
        4e-3 + 1e-3 + 2e-4)
    assert math.isnan(back.iteration_costs.predict(P, prefill_tokens=1))


def test_the_prefix_attention_term_loads_and_a_profile_without_it_reads_as_zero(tmp_path):
    """A prompt chunk of 100 tokens after 200 of prefix attends to 100·200 + 100·101/2 = 25,050 keys."""
    pre = PhaseCost(intercept_s=2e-3, prefill_token_s=1e-5, prefill_ctx_token_s=4e-8)
    prof = Profile(name="x", model="", gpu="", costs=Costs(2e-3, 1e-5, 4e-3, 1e-4),
                   iteration_costs=IterationCosts(prefill=pre))
    back = profiles.load(write(tmp_path, prof.to_json()))
    assert back.iteration_costs.predict(P, prefill_tokens=100, prefill_ctx_tokens=25_050) == pytest.approx(
        2e-3 + 1e-3 + 4e-8 * 25_050)
    old = json.loads(prof.to_json())
    del old["iteration_costs"]["prefill"]["prefill_ctx_token_s"]  # written before the term existed
    back = profiles.load(write(tmp_path, json.dumps(old), name="old.json"))
    assert back.iteration_costs.prefill.prefill_ctx_token_s == 0.0
