"""benchmarks/bench_drafts.py: the layer-skip draft computes exactly the target without the skipped layers (full
forward and cached decoding) and leaves the target untouched; the chain model matches its closed form."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from benchmarks import bench_drafts
from tests.tiny_models import TINY_VOCAB, tiny_lm


@pytest.fixture(scope="module")
def target():
    return tiny_lm(num_layers=5, seed=3).eval()


def _without_layers(target, keep):
    """The reference: a deep copy whose layer list holds only ``keep`` (renumbered)."""
    ref = copy.deepcopy(target)
    ref.model.layers = torch.nn.ModuleList(ref.model.layers[i] for i in keep)
    for j, layer in enumerate(ref.model.layers):
        layer.self_attn.layer_idx = j
    ref.config.num_hidden_layers = len(keep)
    if getattr(ref.config, "layer_types", None) is not None:
        ref.config.layer_types = [target.config.layer_types[i] for i in keep]
    return ref


def test_all_layers_is_the_target(target):
    ids = torch.randint(0, TINY_VOCAB, (1, 12))
    draft = bench_drafts.layer_skip_draft(target, list(range(5)))
    with torch.no_grad():
        torch.testing.assert_close(draft(input_ids=ids).logits, target(input_ids=ids).logits, rtol=0, atol=0)


def _skipped(model, target, keep, tol):
    """``layer_skip_draft(model, keep)``, checked to compute what ``target`` without the other layers computes; with
    the ids it was checked on."""
    ids = torch.randint(0, TINY_VOCAB, (1, 12))
    draft = bench_drafts.layer_skip_draft(model, keep)
    with torch.inference_mode():
        torch.testing.assert_close(draft(input_ids=ids).logits, _without_layers(target, keep)(input_ids=ids).logits,
                                   rtol=tol, atol=tol)
    return draft, ids


def test_skipping_equals_removing_the_layers_and_shares_the_weights(target):
    draft, ids = _skipped(target, target, [0, 2, 4], 1e-6)
    with torch.no_grad():
        full = target(input_ids=ids).logits
    assert not torch.allclose(draft(input_ids=ids).logits, full)  # skipping changed the function
    assert draft.model.layers[1].mlp.gate_proj.weight is target.model.layers[2].mlp.gate_proj.weight
    # the target is untouched: its layers still write their own cache slots
    assert [layer.self_attn.layer_idx for layer in target.model.layers] == list(range(5))
    assert target.config.num_hidden_layers == 5 and len(target.model.layers) == 5


def test_a_target_on_the_lean_path_skips_its_layers_too(target):
    """`load_model` puts a CPU target on the lean path (an instance forward over all its layers); the layer-skipped
    copy must run only its kept layers, not inherit that forward (the stop-56 table read acceptance 1.000 for 2 of 30
    layers kept)."""
    from models.lean_layers import use_lean_forward

    lean = copy.deepcopy(target)
    assert use_lean_forward(lean)
    draft, ids = _skipped(lean, target, [0, 2, 4], 1e-5)
    with torch.inference_mode():
        torch.testing.assert_close(lean(input_ids=ids).logits, target(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    assert draft.model._lean_installed and draft.model.forward is not lean.model.forward


def test_cached_decoding_matches_the_full_forward(target):
    keep = [1, 3]
    ids = torch.randint(0, TINY_VOCAB, (1, 10))
    draft = bench_drafts.layer_skip_draft(target, keep)
    with torch.no_grad():
        full = draft(input_ids=ids, use_cache=False).logits[0]
        out = draft(input_ids=ids[:, :6], use_cache=True)
        cache, steps = out.past_key_values, [out.logits[0, -1]]
        for t in range(6, 10):
            out = draft(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits[0, -1])
    torch.testing.assert_close(torch.stack(steps), full[5:], rtol=1e-5, atol=1e-5)


def test_bad_layer_sets_are_refused(target):
    for keep in ([], [0, 0], [5], [-1]):
        with pytest.raises(ValueError, match="distinct layer indices"):
            bench_drafts.layer_skip_draft(target, keep)


def test_chain_efficiency_is_the_geometric_sum_at_constant_acceptance():
    a = 0.4
    for length in (1, 3, 5):
        e = bench_drafts.chain_efficiency([np.full(20, a)], length)
        assert e.shape == (20 - length,)
        np.testing.assert_allclose(e, (1 - a ** (length + 1)) / (1 - a))
    # a rejected first token ends the chain, whatever follows
    np.testing.assert_allclose(bench_drafts.chain_efficiency([np.array([0.0, 1.0, 1.0, 1.0])], 2), [1.0, 3.0])


class _Latency:
    """A profile whose step is the tables alone, a target pass costing 1 + 0.1 per extra token."""

    class step_ratios:  # noqa: N801
        @staticmethod
        def tree_vector():
            return np.array([1.0, 0.0, 0.0, 0.0])

    @staticmethod
    def t_p(context, tokens):
        return 1.0 + 0.1 * (np.asarray(tokens) - 1)


def test_chain_speedup_is_the_path_estimator_and_picks_the_best_length():
    a, r = 0.8, 0.1
    out = bench_drafts.chain_speedup([np.full(60, a)], _Latency, 100.0, r)
    for length, speedup in out["by_L"].items():
        e = (1 - a ** (length + 1)) / (1 - a)
        assert speedup == pytest.approx(e / (1 + 0.1 * length + r * length))
    assert out["speedup"] == max(out["by_L"].values()) and out["by_L"][out["L"]] == out["speedup"]
    # varying acceptance: the harmonic mean of E (path), not its arithmetic mean
    acc = [np.tile([0.0, 1.0], 40)]
    e = bench_drafts.chain_efficiency(acc, 1)
    assert bench_drafts.chain_speedup(acc, _Latency, 100.0, r)["by_L"][1] == pytest.approx(
        e.size / np.sum(1.2 / e))


def test_kept_rows_carry_their_source_and_refuse_what_is_missing_or_remeasured(tmp_path):
    import json

    from benchmarks.bench_drafts import carried_rows

    out = tmp_path / "drafts.json"
    out.write_text(json.dumps({"latency_profile": "old.json", "machine": {"threads": 2},
                               "rows": {"self_draft": {"acceptance_test_T1.0": 0.37}, "eagle": {}}}))
    kept = carried_rows(out, ["self_draft"], {"eagle": {}})
    assert kept == {"self_draft": {"acceptance_test_T1.0": 0.37,
                                   "carried_over": {"latency_profile": "old.json", "machine": {"threads": 2}}}}
    assert carried_rows(out, [], {}) == {}
    with pytest.raises(SystemExit, match="no rows"):
        carried_rows(out, ["layer_skip_9"], {})
    with pytest.raises(SystemExit, match="measured in this run"):
        carried_rows(out, ["eagle"], {"eagle": {}})
