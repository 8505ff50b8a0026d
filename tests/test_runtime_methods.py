"""`SelectorRuntime(..., methods=[...])`: an ``auto`` selector restricted to some of its methods (numpy only)."""

from __future__ import annotations

import numpy as np
import pytest
from selector_helpers import SPACE, random_inputs, random_selector, toy_latency

from decoding import pricing
from decoding.policy import RootFeatures
from decoding.sampling import Sampling
from export.onnx_export import export_selector
from export.runtime import SelectorArtifactError, SelectorRuntime

METHODS = ("traversal", "specinfer", "bv")


def _seconds(schema, inputs):
    lat = toy_latency()
    ctx = inputs["scalars"][:, schema.scalars.index("context_length")]
    return pricing.step_seconds(lat, ctx.astype(int), list(SPACE), METHODS, schema.feature_set).astype(np.float32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    net, meta, schema = random_selector("paper", methods=METHODS, seed=3)
    inputs = random_inputs(schema, 32, seed=1)
    out = tmp_path_factory.mktemp("sel") / "selector"
    export_selector(net, meta, out, inputs, _seconds(schema, inputs))
    return out


def test_restricted_choice_is_the_argmax_over_that_methods_valid_outputs(folder):
    full = SelectorRuntime(folder, latency=toy_latency())
    inputs = random_inputs(full.schema, 200, seed=5)
    seconds = _seconds(full.schema, inputs)
    e, unrestricted = full.run_graph(inputs, seconds)
    for only in (["specinfer"], ["bv"], ["traversal", "bv"]):
        rt = SelectorRuntime(folder, latency=toy_latency(), methods=only)
        _, choice = rt.run_graph(inputs, seconds)
        assert {rt.table[c][0] for c in choice} <= set(only)
        assert rt.valid[choice].all()  # bv's branching-tree outputs are invalid: never chosen
        allowed = np.array([m in only for m, _ in rt.table]) & rt.valid
        want = np.argmax(np.where(allowed, e / seconds, -np.inf), axis=1)
        np.testing.assert_array_equal(choice, want)
        # where the free choice already was an allowed output, the restriction changes nothing
        same = allowed[unrestricted]
        np.testing.assert_array_equal(choice[same], unrestricted[same])
        assert not same.all() or only == ["traversal", "bv"], f"the restriction to {only} never mattered"
    both = SelectorRuntime(folder, latency=toy_latency(), methods=list(METHODS))
    np.testing.assert_array_equal(both.run_graph(inputs, seconds)[1], unrestricted)


def test_restricted_select_returns_only_that_method(folder):
    rt = SelectorRuntime(folder, latency=toy_latency(), methods=["specinfer"])
    assert "restricted to ['specinfer']" in repr(rt)
    rng = np.random.default_rng(0)
    for i in range(10):
        p = rng.dirichlet(np.ones(8))
        root = RootFeatures(50 + 40 * i, Sampling(0.7), p, rng.dirichlet(np.ones(8)), p, rng.normal(size=12),
                            rng.normal(size=8), rng.normal(size=8))
        choice = rt.select(root)
        assert choice.method == "specinfer" and choice.action in SPACE


@pytest.mark.parametrize("methods", [["gbv"], []])
def test_unknown_or_empty_restriction_fails_clearly(folder, methods):
    with pytest.raises(SelectorArtifactError, match="cannot restrict the selector"):
        SelectorRuntime(folder, latency=toy_latency(), methods=methods)


def test_each_methods_outputs_pay_its_verification(folder):
    """With a profile that timed each method's verify call, the runtime prices every output of method m as
    the shape's step plus m's verification beyond Traversal's, and training's step costs agree."""
    import dataclasses


    trees = [a for a in SPACE if a.tree_size]
    verify = {"traversal": {str(a): 3e-4 for a in trees}, "specinfer": {str(a): 5e-4 for a in trees},
              "bv": {str(a): 2e-3 for a in trees if a.K == 1}}
    lat = dataclasses.replace(toy_latency(), verify_seconds=verify)
    rt, base = SelectorRuntime(folder, latency=lat), SelectorRuntime(folder, latency=toy_latency())
    got, want = rt.step_seconds(300), base.step_seconds(300)
    extra = {"traversal": 0.0, "specinfer": 2e-4, "bv": 1.7e-3}
    for o, (method, action) in enumerate(rt.table):
        owed = extra[method] if action.tree_size and (method != "bv" or action.K == 1) else 0.0
        assert got[o] == pytest.approx(want[o] + owed, abs=1e-7), (method, action)
    costs = pricing.step_seconds(lat, np.array([300, 120]), list(SPACE), METHODS, rt.schema.feature_set)
    np.testing.assert_allclose(costs[0], got - rt.inference_seconds, rtol=1e-6)
