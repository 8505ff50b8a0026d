"""Profiling (data_collection/profile.py, stage profile) on tiny random models."""

import json

import numpy as np
import pytest
import torch
from engine_helpers import VOCAB, untied_pair
from tiny_models import tiny_lm

from data_collection.profile import profile_pair, step_times, tile_ids, time_grid
from decoding.actions import Action, parse_action
from decoding.engine.cache import KVState
from decoding.engine.drafting import draft_tree
from decoding.engine.tree_pass import prefill
from decoding.latency import LatencyModel, draft_forwards
from decoding.sampling import Sampling


@pytest.fixture(scope="module")
def pair():
    return untied_pair(seed=3)


def test_tiny_profile_is_a_valid_latency_model(pair, one_thread, tmp_path):
    target, draft = pair
    m = profile_pair(target, draft, VOCAB, list(range(3, 40)), contexts=[4, 16], draft_rows=[1, 2, 3],
                     target_tokens=[1, 2, 5], repeats=2, warmup=1, feature_repeats=3, meta={"target": "tiny"})
    assert m.draft_seconds.shape == (2, 3) and m.target_seconds.shape == (2, 3)
    assert np.all(m.draft_seconds > 0) and np.all(m.target_seconds > 0) and m.feature_seconds > 0
    assert m.meta["target"] == "tiny" and m.meta["threads"] == 1 and "torch" in m.meta["versions"]
    assert m.meta["settings"]["repeats"] == 2 and m.meta["settings"]["feature_fn"]
    back = LatencyModel.load(m.save(tmp_path / "latency.json"))
    assert back.to_dict() == json.loads(json.dumps(m.to_dict()))
    assert back.step_seconds(10, [Action(2, 1, 1), Action(1, 0, 0)]).shape == (2,)


def test_step_overhead_is_what_whole_engine_steps_cost_beyond_the_modelled_forwards(pair, one_thread):
    from data_collection.step_overhead import measure_step_overhead

    target, draft = pair
    m = profile_pair(target, draft, VOCAB, list(range(3, 40)), contexts=[4, 32], draft_rows=[1, 2, 3],
                     target_tokens=[1, 2, 3, 4, 5, 6], repeats=2, warmup=1, feature_repeats=3)
    overhead, by_action = measure_step_overhead(target, draft, VOCAB, list(range(3, 12)), m, new_tokens=6)
    assert set(by_action) == {"1,0,0", "1,0,1", "3,0,1", "1,1,1", "2,1,2", "1,2,1", "3,1,1", "2,0,2", "1,3,0"}
    for row in by_action.values():  # 2 seeds x (steps - 1): the first step of a decode holds the prefill
        assert row["steps"] >= 2 and row["measured_ms"] > 0
    assert overhead["plain"] == pytest.approx(by_action["1,0,0"]["overhead_ms"] / 1e3)
    # the fit is least squares with an intercept: its residuals over the speculative shapes sum to zero
    spec = [a for a in by_action if a != "1,0,0"]
    assert abs(sum(by_action[a]["overhead_ms"] - by_action[a]["fitted_overhead_ms"] for a in spec)) < 1e-6
    assert overhead["per_forward"] == overhead["per_node"] == 0.0  # the default: one constant (FIT_TERMS)
    three, by3 = measure_step_overhead(target, draft, VOCAB, list(range(3, 12)), m, new_tokens=6, fit_terms=3)
    assert three["per_forward"] != 0.0 and three["per_node"] != 0.0
    assert abs(sum(by3[a]["overhead_ms"] - by3[a]["fitted_overhead_ms"] for a in spec)) < 1e-6
    # priced with it, a model charges each shape its fitted overhead on top of the modelled forwards
    with_overhead = LatencyModel(**{k: getattr(m, k) for k in ("contexts", "draft_rows", "draft_seconds",
                                                                "target_tokens", "target_seconds",
                                                                "feature_seconds")}, step_overhead=overhead)
    for a in ("1,0,0", "3,1,1"):
        fitted = by_action[a].get("fitted_overhead_ms", by_action[a]["overhead_ms"]) / 1e3
        assert with_overhead.step_seconds(10, [parse_action(a)])[0] == pytest.approx(
            m.step_seconds(10, [parse_action(a)])[0] + fitted)



def test_step_overhead_divides_out_a_machine_that_ran_slower_than_the_tables():
    """A round decoded while the machine ran 1.5x slower (every forward and the work beyond them alike) reads the
    same overhead as one at the tables' speed; what differs between shapes stays. Without the speed factor the slow
    round adds half of every modelled step to the residuals (the profiles whose fit priced every tree above a plain
    step)."""
    from data_collection.step_overhead import TimedStep, fit_step_overhead, speed_factors

    m = LatencyModel(contexts=[4, 64], draft_rows=[1, 2], draft_seconds=np.full((2, 2), 4e-3),
                     target_tokens=[1, 2, 3], target_seconds=np.array([[20e-3, 24e-3, 27e-3], [30e-3, 34e-3, 37e-3]]),
                     feature_seconds=1e-5)
    beyond = {Action(1, 0, 0): 1e-3, Action(1, 0, 1): 3e-3, Action(2, 0, 1): 5e-3}  # the truth, at table speed
    steps = []
    for rnd, slow in enumerate((1.0, 1.5)):
        for a, extra in beyond.items():
            for ctx in (10, 30, 50):
                t_p = float(m.t_p(ctx, 1 + a.tree_size))
                total = float(m.step_seconds(ctx, [a])[0]) + extra
                steps.append(TimedStep(rnd, a, ctx, slow * total, slow * t_p))
    assert speed_factors(steps, m) == pytest.approx({0: 1.0, 1: 1.5})
    overhead, by_action = fit_step_overhead(steps, m, list(beyond))
    for a, extra in beyond.items():
        assert by_action[str(a)]["overhead_ms"] == pytest.approx(extra * 1e3)
        assert by_action[str(a)]["speed_factor"] == pytest.approx(1.25)
        assert by_action[str(a)]["measured_ms"] > by_action[str(a)]["at_table_speed_ms"]  # raw times kept
    assert overhead["plain"] == pytest.approx(1e-3) and overhead["speculative"] == pytest.approx(4e-3)


def test_step_overhead_without_a_tree_less_or_a_speculative_action_fails_clearly(pair, one_thread):
    """The fit needs both kinds of step: the clear error comes before any decoding (and any fit matrix)."""
    from data_collection.step_overhead import measure_step_overhead

    target, draft = pair
    flat = LatencyModel(contexts=[4, 32], draft_rows=[1, 2, 3], draft_seconds=np.full((2, 3), 1e-3),
                        target_tokens=[1, 2, 3], target_seconds=np.full((2, 3), 2e-3), feature_seconds=1e-5)
    for actions in ([Action(1, 0, 0)], [Action(1, 0, 1)], [Action(9, 9, 9)]):  # the last: not on the grid
        with pytest.raises(ValueError, match="needs the tree-less action and at least one speculative"):
            measure_step_overhead(target, draft, VOCAB, list(range(3, 12)), flat, actions=actions, new_tokens=3,
                                  seeds=(0,))
    with pytest.raises(ValueError, match="fit_terms"):
        measure_step_overhead(target, draft, VOCAB, [3, 4], flat, fit_terms=4)


def test_time_grid_leaves_caches_at_each_context_and_keeps_raw_repeats(pair, one_thread):
    target, draft = pair
    grid = time_grid(target, draft, VOCAB, [5, 6, 7], contexts=[3, 8], draft_rows=[1, 4], target_tokens=[1, 3],
                     repeats=3, warmup=0)
    assert grid.draft.shape == (2, 2, 3) and grid.target.shape == (2, 2, 3) and np.all(grid.draft > 0)
    p, q_prev, q_root = grid.rows
    for row in (p, q_prev, q_root):  # real transformed rows, as the engine hands them to the features
        assert row.shape == (VOCAB,) and row.dtype == np.float64 and row.sum() == pytest.approx(1.0)


def test_step_times_keeps_train_drafts_metric_keys(pair, one_thread):
    target, draft = pair
    out = step_times(target, draft, tile_ids([4, 5, 6], 20), VOCAB, reps=3, warmup=1)
    assert out["context_tokens"] == 20 and out["reps"] == 3 and out["threads"] == 1
    assert out["step_time_ratio"] == pytest.approx(out["draft_step_ms"] / out["target_step_ms"])
    assert 0 < out["draft_step_ms_min"] <= out["draft_step_ms"]


@pytest.mark.parametrize("action", [Action(1, 3, 0), Action(3, 0, 2), Action(2, 2, 3), Action(4, 1, 1)])
def test_priced_draft_forwards_are_the_forwards_the_engine_makes(action, one_thread):
    """draft_forwards (what step_seconds prices) lists exactly the (cache length, rows) of each draft call."""
    draft = tiny_lm(2, seed=5)
    calls = []
    draft.register_forward_pre_hook(  # mask [1, 1, rows, cached + rows]
        lambda _m, _a, kw: calls.append((kw["attention_mask"].shape[-1] - kw["input_ids"].shape[1],
                                         kw["input_ids"].shape[1])), with_kwargs=True)
    l = 7  # noqa: E741  (context length: tokens before the root)
    kv = KVState(draft)
    with torch.inference_mode():
        prefill(kv, list(range(3, 3 + l)))
        calls.clear()
        logits, _ = prefill(kv, [20])  # the root's draft step
        q_root = torch.softmax(logits.float(), -1).double().numpy()
        draft_tree(kv, len(kv) - 1, q_root, action, Sampling(), VOCAB, np.random.default_rng(0))
    _, ctx, rows = draft_forwards(l, [action])
    assert calls == list(zip(ctx.tolist(), rows.tolist(), strict=True))


@pytest.fixture
def tiny_params(tmp_path):
    from tiny_models import save_tiny_model

    t = save_tiny_model(tmp_path / "target", 2, seed=0)
    d = save_tiny_model(tmp_path / "draft", 1, seed=1)
    path = tmp_path / "params.yaml"
    path.write_text(
        f"model:\n  target: hf:{t}\n  draft: hf:{d}\n  device: cpu\n  threads: 1\n"
        "decode:\n  prompt: w5 w9 w33\n"
        "train_draft:\n  layers: 1\n  adapter_width: 16\n  vocab_subset_size: 32\n"
        "actions:\n  K: [1, 2]\n  L1: [0, 1]\n  L2: [0, 1]\n"
        f"profile:\n  contexts: [4, 12]\n  draft_rows: [1, 2]\n  target_tokens: [1, 2, 4]\n  repeats: 2\n"
        f"  warmup: 1\n  feature_repeats: 2\n  out: {tmp_path / 'latency.json'}\n")
    return path


@pytest.mark.parametrize("draft", ["hf", "untrained"])
def test_profile_stage_writes_the_latency_model(tiny_params, tmp_path, draft, capsys, one_thread):
    from pipeline.cli import main

    extra = [] if draft == "hf" else ["--set", f"model.draft=self_draft:{tmp_path / 'not_built'}"]
    assert main(["profile", "--params", str(tiny_params), "--no-progress", *extra]) == 0
    m = LatencyModel.load(tmp_path / "latency.json")
    assert m.contexts.tolist() == [4, 12] and m.target_tokens.tolist() == [1, 2, 4]
    assert m.meta["threads"] == 1 and m.meta["target"].startswith("hf:")
    # the grid (K <= 2, trees of <= 3 nodes) prices 1,0,1 1,1,1 1,2,1 1,3,0; the default fit is one constant per
    # speculative step: the mean residual of those shapes
    by_action = m.meta["step_overhead_by_action"]
    assert set(by_action) == {"1,0,0", "1,0,1", "1,1,1", "1,2,1", "1,3,0"}
    assert m.step_overhead["per_node"] == 0.0 and m.step_overhead["per_forward"] == 0.0
    spec = [r["overhead_ms"] for a, r in by_action.items() if a != "1,0,0"]
    assert m.step_overhead["speculative"] * 1e3 == pytest.approx(np.mean(spec))
    # each decoded shape is priced with its own residual
    assert set(m.action_overhead) == set(by_action)
    assert all(m.action_overhead[a] * 1e3 == pytest.approx(r["overhead_ms"]) for a, r in by_action.items())
    # every method's verify call on every tree of the action grid it supports (chain-only methods: chains)
    from decoding.actions import ActionSpace

    space = list(ActionSpace([1, 2], [0, 1], [0, 1]))
    trees = {str(a) for a in space if a.tree_size}
    assert set(m.verify_seconds["traversal"]) == set(m.verify_seconds["gbv"]) == trees
    assert set(m.verify_seconds["naive"]) == {str(a) for a in space if a.tree_size and a.is_chain} != trees
    assert np.all(np.isfinite(m.verify_offset("gbv", space)))
    if draft == "untrained":  # the self-draft is not built yet: an untrained one of the configured shape
        assert m.meta["draft_timed"].startswith("untrained self-draft") and "not_built" in m.meta["draft"]
    else:
        assert m.meta["draft_timed"] == m.meta["draft"]
    assert "profile written to" in capsys.readouterr().out


@pytest.mark.parametrize("override, fragment", [
    ("profile.draft_rows=[2, 3]", "draft_rows must start at 1"),
    ("profile.contexts=[256, 64]", "strictly ascending"),
    ("model.threads=0", "threads must be >= 1"),
])
def test_profile_config_errors(override, fragment):
    from pipeline.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=fragment):
        load_config(None, [override])
