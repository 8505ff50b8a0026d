"""Online calibration of the latency model (`decoding.calibration`), the runtime that applies it and the decoder's
step-time hook that feeds it."""

from __future__ import annotations

import numpy as np
import pytest
from selector_helpers import SPACE, random_inputs, random_selector, toy_latency

from decoding.actions import Action
from decoding.calibration import OnlineCalibration
from decoding.policy import Cascade, RootFeatures, StepTiming
from decoding.sampling import Sampling
from export.onnx_export import export_selector
from export.runtime import SelectorRuntime


def _t(seconds, draft, target, catch_up=1):
    return StepTiming(seconds, draft, target, catch_up)


def test_forward_factors_and_rest_shifts_are_decayed_means():
    cal = OnlineCalibration(half_life=2.0)
    parts = np.array([0.010, 0.0]), np.array([0.020, 0.025]), np.array([0.028, 0.024])  # 2,0,1-like, plain
    spec = np.array([True, False])
    np.testing.assert_array_equal(cal.price(*parts, spec), parts[2])  # no observation: the profile as it is
    # a speculative step: draft as modelled, target pass 1.5x, rest 3 ms where the model says -2 ms
    cal.observe(True, _t(0.010 + 0.030 + 0.003, 0.010, 0.030), 0.010, 0.020, 0.028)
    assert cal.factor("draft") == pytest.approx(1.0) and cal.factor("target") == pytest.approx(1.5)
    assert cal.shift(True) == pytest.approx(0.005) and cal.shift(False) == pytest.approx(0.005)  # borrowed
    # the plain step, never observed, is priced by the target factor learned from speculative steps
    np.testing.assert_allclose(cal.price(*parts, spec), [0.010 + 0.030 + (-0.002) + 0.005,
                                                         1.5 * 0.025 + (-0.001) + 0.005])
    w = 0.5 ** (1 / 2)  # the weight of a step one step older, at a half-life of 2 steps
    cal.observe(False, _t(0.050, 0.0, 0.048), 0.0, 0.025, 0.024)  # a plain step: target 48 ms for 25 modelled
    assert cal.factor("target") == pytest.approx((w * 0.030 + 0.048) / (w * 0.020 + 0.025))
    assert cal.factor("draft") == pytest.approx(1.0)  # no draft forward in a plain step: only decayed
    assert cal.shift(False) == pytest.approx(0.002 - (-0.001)) and cal.shift(True) == pytest.approx(0.005)
    assert cal.to_dict()["steps"] == {"plain": 1, "speculative": 1}
    assert set(cal.to_dict()["factors"]) == {"draft", "target"}


def test_it_follows_a_drift_and_ignores_junk():
    cal = OnlineCalibration(half_life=8.0, max_factor=3.0)
    for _ in range(200):
        cal.observe(True, _t(0.030, 0.010, 0.020), 0.010, 0.020, 0.030)
    for _ in range(64):  # eight half-lives with the target pass at 1.6x: the old phase weighs 2^-8
        cal.observe(True, _t(0.042, 0.010, 0.032), 0.010, 0.020, 0.030)
    assert cal.factor("target") == pytest.approx(1.6, rel=0.01) and cal.shift(True) == pytest.approx(0.0, abs=1e-12)
    before = (cal.factor("target"), dict(cal.steps))
    for bad in (_t(float("nan"), 0.01, 0.02), _t(0.03, 0.01, float("inf")), _t(-1.0, 0.01, 0.02),
                _t(0.5, 0.4, 0.05, catch_up=300)):  # the last: a draft prefilled with the prompt
        cal.observe(True, bad, 0.010, 0.020, 0.030)
    assert (cal.factor("target"), cal.steps) == before
    one = OnlineCalibration(max_factor=3.0)
    one.observe(False, _t(10.0, 0.0, 9.9), 0.0, 0.02, 0.021)  # a step stalled by the OS: clipped to 3x
    assert one.factor("target") == pytest.approx(3.0)
    one.reset()
    assert one.factor("target") == 1.0 and one.shift(False) == 0.0 and one.steps == {"plain": 0, "speculative": 0}
    with pytest.raises(ValueError, match="half_life"):
        OnlineCalibration(half_life=0)


SPECULATIVE_E = 1.5  # the constant selector below: Ê = 1.5 for every tree, 1 (fixed) for the plain step


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    import torch

    net, meta, schema = random_selector("target_only", seed=4, hidden=(12, 8))
    with torch.no_grad():  # a constant selector, so that which decision a price flips is known exactly
        net.mlp[-1].weight.zero_()
        net.mlp[-1].bias.fill_(SPECULATIVE_E)
    inputs = random_inputs(schema, 16, seed=1)
    lat = toy_latency()
    ctx = inputs["scalars"][:, schema.scalars.index("context_length")]
    seconds = np.stack([lat.step_seconds(int(c), list(SPACE), features="target_only") for c in ctx]).astype(np.float32)
    out = tmp_path_factory.mktemp("sel") / "selector"
    export_selector(net, meta, out, inputs, seconds)
    return out


def _root(context_length: int) -> RootFeatures:
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(8))
    return RootFeatures(context_length, Sampling(1.0), p, None, None, rng.normal(size=12), None, None,
                        rng.normal(size=12))


@pytest.mark.parametrize("slowdown", [1.1, 1.4])
def test_runtime_prices_with_the_factors_and_declines_when_speculation_runs_slow(folder, slowdown):
    plain = SelectorRuntime(folder, latency=toy_latency())
    cal = SelectorRuntime(folder, latency=toy_latency(), calibrate=True)
    assert plain.calibration is None and "calibrated online" in repr(cal)
    c = 100
    base = plain.step_seconds(c)
    np.testing.assert_array_equal(cal.step_seconds(c), base)  # nothing observed yet
    spec = np.array([a.tree_size > 0 for _, a in cal.table])
    best = plain.select(_root(c)).action
    assert best.tree_size, "the constant selector must speculate on the profile's prices"
    o = next(i for i, (_, a) in enumerate(cal.table) if a == best)
    ar = next(i for i, (_, a) in enumerate(cal.table) if a.tree_size == 0)
    lat = toy_latency()
    draft, target, _ = (float(x[0, 0]) for x in lat.step_parts_at([c], [best], "target_only"))
    plain_target = float(lat.step_parts_at([c], [Action(1, 0, 0)], "target_only")[1][0, 0])
    cal.observe_step(Action(1, 0, 0), c, StepTiming(float(base[ar]), 0.0, plain_target))  # plain: as profiled
    extra = (slowdown - 1) * float(base[o])
    for _ in range(50):  # the chosen tree's steps run `slowdown` x slower than profiled, beyond their forwards
        cal.observe_step(best, c, StepTiming(float(base[o]) + extra, draft, target))
    assert cal.calibration.factor("draft") == pytest.approx(1.0) and cal.calibration.factor("target") == 1.0
    assert cal.calibration.shift(True) == pytest.approx(extra, rel=1e-4) and abs(cal.calibration.shift(False)) < 1e-8
    got = cal.step_seconds(c)
    assert got[o] == pytest.approx(slowdown * base[o], rel=1e-4)
    np.testing.assert_allclose(got[spec], base[spec] + extra, rtol=1e-4)
    np.testing.assert_allclose(got[~spec], base[~spec], rtol=1e-5)
    # the tree pays while 1.5 / (slowdown * T_tree) > 1 / T_plain
    pays = SPECULATIVE_E / (slowdown * float(base[o])) > 1 / float(base[ar])
    assert cal.select(_root(c)).action.tree_size > 0 if pays else cal.select(_root(c)).action.tree_size == 0
    assert pays == (slowdown == 1.1)  # the two cases are on either side of the break-even
    before = cal.calibration.steps["speculative"]
    cal.observe_step(Action(3, 3, 3), c, StepTiming(1.0, 0.5, 0.4))  # not an output of this selector: ignored
    assert cal.calibration.steps["speculative"] == before
    plain.observe_step(best, c, StepTiming(9.0, 1.0, 1.0))  # without calibrate the hook does nothing
    np.testing.assert_array_equal(plain.step_seconds(c), base)


def test_cascade_passes_the_step_times_on():
    seen = []

    class Stage:
        needs_draft = False

        def __init__(self, tag):
            self.tag = tag

        def select(self, features):
            return Action(1, 0, 0)

        def observe_step(self, action, context_length, seconds):
            seen.append((self.tag, action, context_length, seconds))

    timing = StepTiming(0.5, 0.1, 0.3)
    Cascade(Stage(1), Stage(2)).observe_step(Action(2, 0, 1), 7, timing)
    assert seen == [(1, Action(2, 0, 1), 7, timing), (2, Action(2, 0, 1), 7, timing)]


def test_the_decoder_reports_every_step(one_thread):
    from engine_helpers import untied_pair

    from decoding.engine import SpeculativeDecoder

    target, draft = untied_pair(seed=0, noise=0.3)
    observed = []

    class Alternating:
        needs_hidden_states = False
        needs_draft = False

        def select(self, features):
            return Action(2, 1, 1) if features.context_length % 2 else Action(1, 0, 0)

        def observe_step(self, action, context_length, timing):
            observed.append((action, context_length, timing))

    steps = []
    prompt = [5, 9, 33, 12]
    res = SpeculativeDecoder(target, draft, 64).generate(prompt, 24, "traversal", Alternating(), Sampling(1.0), 3,
                                                         on_step=lambda state, step: steps.append(step))
    assert len(observed) == len(steps) == res.stats.steps
    assert [a for a, _, _ in observed] == [s.action for s in steps]
    contexts = [c for _, c, _ in observed]
    assert contexts[0] == len(prompt) - 1
    assert contexts[1:] == [c + len(s.tokens) for c, s in zip(contexts, steps[:-1], strict=False)]
    timings = [t for _, _, t in observed]
    assert all(t.seconds > 0 and t.target_seconds > 0 and t.rest_seconds >= 0 for t in timings)
    assert sum(t.seconds for t in timings) <= res.stats.time_total
    assert sum(t.target_seconds for t in timings) <= res.stats.time_target  # the prefill is no step's
    assert sum(t.draft_seconds for t in timings) == pytest.approx(res.stats.time_draft)
    for action, _, t in observed:
        assert (t.draft_seconds > 0) == (action.tree_size > 0)  # a plain step drafts nothing
    spec = [t for a, _, t in observed if a.tree_size]
    assert spec[0].draft_catch_up >= len(prompt) and all(t.draft_catch_up <= 3 for t in spec[1:])
