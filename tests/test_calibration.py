"""Online calibration of the latency model (`decoding.calibration`), the runtime that applies it and the decoder's
step-time hook that feeds it."""

from __future__ import annotations

import numpy as np
import pytest
from selector_helpers import SPACE, random_inputs, random_selector, toy_latency

from decoding.actions import Action
from decoding.calibration import OnlineCalibration
from decoding.policy import Cascade, RootFeatures
from decoding.sampling import Sampling
from export.onnx_export import export_selector
from export.runtime import SelectorRuntime


def test_factors_are_ratios_of_decayed_means():
    cal = OnlineCalibration(half_life=2.0)
    assert cal.factor(False) == cal.factor(True) == 1.0  # no observation: the profile as it is
    cal.observe(False, 0.030, 0.020)
    assert cal.factor(False) == pytest.approx(1.5) and cal.factor(True) == pytest.approx(1.5)  # borrowed
    w = 0.5 ** (1 / 2)  # the weight of a step one step older, at a half-life of 2 steps
    cal.observe(True, 0.080, 0.040)
    cal.observe(True, 0.030, 0.030)
    assert cal.factor(True) == pytest.approx((w * 0.080 + 0.030) / (w * 0.040 + 0.030))  # means, not mean ratios
    assert cal.factor(False) == pytest.approx(1.5)  # the plain class keeps its own once it has one
    np.testing.assert_allclose(cal.factors(np.array([True, False, True])),
                               [cal.factor(True), 1.5, cal.factor(True)])
    assert cal.to_dict()["steps"] == {"plain": 1, "speculative": 2}


def test_it_follows_a_drift_and_ignores_junk():
    cal = OnlineCalibration(half_life=8.0, max_factor=3.0)
    for _ in range(200):
        cal.observe(True, 0.020, 0.020)
    for _ in range(64):  # eight half-lives at 1.6x: the old phase weighs 2^-8
        cal.observe(True, 0.032, 0.020)
    assert cal.factor(True) == pytest.approx(1.6, rel=0.01)
    before = cal.factor(True)
    for bad in ((float("nan"), 0.02), (0.02, 0.0), (-1.0, 0.02), (float("inf"), 0.02)):
        cal.observe(True, *bad)
    assert cal.factor(True) == before and cal.steps["speculative"] == 264
    one = OnlineCalibration(max_factor=3.0)
    one.observe(False, 10.0, 0.02)  # a step stalled by the OS: clipped to 3x
    assert one.factor(False) == pytest.approx(3.0)
    one.reset()
    assert one.factor(False) == 1.0 and one.steps == {"plain": 0, "speculative": 0}
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
    cal.observe_step(Action(1, 0, 0), c, float(base[ar]))  # plain steps run as profiled
    for _ in range(50):  # the chosen tree runs `slowdown` x slower than profiled
        cal.observe_step(best, c, slowdown * float(base[o]))
    got = cal.step_seconds(c)
    np.testing.assert_allclose(got[spec], slowdown * base[spec], rtol=1e-5)
    np.testing.assert_allclose(got[~spec], base[~spec], rtol=1e-6)
    # the tree pays while 1.5 / (slowdown * T_tree) > 1 / T_plain
    pays = SPECULATIVE_E / (slowdown * float(base[o])) > 1 / float(base[ar])
    assert cal.select(_root(c)).action.tree_size > 0 if pays else cal.select(_root(c)).action.tree_size == 0
    assert pays == (slowdown == 1.1)  # the two cases are on either side of the break-even
    before = cal.calibration.steps["speculative"]
    cal.observe_step(Action(3, 3, 3), c, 1.0)  # not an output of this selector: ignored
    assert cal.calibration.steps["speculative"] == before
    plain.observe_step(best, c, 9.0)  # without calibrate the hook does nothing
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

    Cascade(Stage(1), Stage(2)).observe_step(Action(2, 0, 1), 7, 0.5)
    assert seen == [(1, Action(2, 0, 1), 7, 0.5), (2, Action(2, 0, 1), 7, 0.5)]


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

        def observe_step(self, action, context_length, seconds):
            observed.append((action, context_length, seconds))

    steps = []
    prompt = [5, 9, 33, 12]
    res = SpeculativeDecoder(target, draft, 64).generate(prompt, 24, "traversal", Alternating(), Sampling(1.0), 3,
                                                         on_step=lambda state, step: steps.append(step))
    assert len(observed) == len(steps) == res.stats.steps
    assert [a for a, _, _ in observed] == [s.action for s in steps]
    contexts = [c for _, c, _ in observed]
    assert contexts[0] == len(prompt) - 1
    assert contexts[1:] == [c + len(s.tokens) for c, s in zip(contexts, steps[:-1], strict=False)]
    assert all(s > 0 for _, _, s in observed) and sum(s for _, _, s in observed) <= res.stats.time_total
