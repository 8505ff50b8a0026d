"""Profiling (data_collection/forward_tables.py, stage profile) on tiny random models."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from engine_helpers import VOCAB, untied_pair
from tiny_models import tiny_lm

from data_collection.forward_tables import Grid, TimedPair, profile_pair, step_times, tile_ids, time_grid
from decoding import pricing
from decoding.actions import Action, ActionSpace
from decoding.latency import LatencyModel, StepRatios
from decoding.pricing import draft_forwards
from decoding.sampling import Sampling
from engine.cache import KVState
from engine.drafting import DraftRoot, DraftRule, draft_tree
from engine.tree_pass import prefill


@pytest.fixture(scope="module")
def pair():
    return untied_pair(seed=3)


def test_tiny_profile_is_a_valid_latency_model(pair, one_thread, tmp_path):
    target, draft = pair
    m = profile_pair(TimedPair(target, draft, VOCAB), list(range(3, 40)), Grid([4, 16], [1, 2, 3], [1, 2, 5], 2, 1),
                     meta={"target": "tiny"})
    assert m.draft_seconds.shape == (2, 3) and m.target_seconds.shape == (2, 3)
    assert np.all(m.draft_seconds > 0) and np.all(m.target_seconds > 0) and m.feature_seconds == {}
    assert m.meta["target"] == "tiny" and m.meta["threads"] == 1 and "torch" in m.meta["versions"]
    assert m.meta["settings"]["repeats"] == 2
    back = LatencyModel.load(m.save(tmp_path / "latency.json"))
    assert back.to_dict() == json.loads(json.dumps(m.to_dict()))
    assert pricing.step_seconds(back, [10], [Action(2, 1, 1), Action(1, 0, 0)]).shape == (1, 2)


def test_step_ratios_decode_every_class_in_rounds_and_price_them_against_plain_steps(pair, one_thread):
    from data_collection.step_prices import PriceRounds, measure_step_ratios

    target, draft = pair
    m = profile_pair(TimedPair(target, draft, VOCAB), list(range(3, 40)),
                     Grid([4, 32], [1, 2, 3], [1, 2, 3, 4, 5, 6], 2, 1))
    actions = [Action(1, 0, 0), Action(2, 0, 1), Action(1, 2, 0)]
    ratios, by_class = measure_step_ratios(TimedPair(target, draft, VOCAB), [list(range(3, 12)), list(range(5, 20))],
                                           m, actions, PriceRounds([1, 2], new_tokens=4, rounds=2))
    assert set(by_class) == {"plain", "traversal:2,0,1", "traversal:1,2,0", "lookup:1", "lookup:2"}
    assert by_class["plain"]["ratio"] == pytest.approx(1.0)  # each round's plain steps over their own mean
    for row in by_class.values():  # the mean of all steps lies between the rounds' means (up to float rounding)
        slack = 1e-9 * row["ratio"]
        assert row["steps"] >= 2 and row["ratio"] > 0
        assert row["round_min"] - slack <= row["ratio"] <= row["round_max"] + slack
    for key in ("traversal:2,0,1", "traversal:1,2,0", "lookup:1", "lookup:2"):
        assert by_class[key]["fitted_ratio"] > 0
    assert all(v >= 0 for v in [*ratios.tree.values(), *ratios.chain.values()])
    assert ratios.tree != StepRatios().tree and ratios.chain != StepRatios().chain  # fitted, not the defaults
    assert ratios.plain_scale > 0 and 9 <= ratios.context <= 30


def _timed(latency, truth: dict, speed) -> list:
    """Timed steps of a profile run: each class decode between two plain decodes; ``speed(round, slot)`` is how much
    slower the machine runs at that point (a phase)."""
    from data_collection.step_prices import TimedStep

    steps, classes = [], [k for k in truth if k != "plain"]
    for rnd in range(2):
        plan = ["plain"] + [k for key in classes for k in (key, "plain")]
        for slot, key in enumerate(plan):
            steps += [TimedStep(rnd, key, ctx, speed(rnd, slot) * float(latency.t_p(ctx, 1)) * truth[key], slot)
                      for ctx in (10, 30, 50)]
    return steps


def test_step_ratios_cancel_phases_and_fit_the_line_the_steps_follow():
    """Steps whose true ratios follow pricing's line give back its coefficients, also when one round runs 1.5x slower
    and the machine drifts within a round: each step is divided by the plain decodes right around it."""
    from data_collection.step_prices import fit_step_ratios

    m = LatencyModel(contexts=[4, 64], draft_rows=[1, 2, 3], draft_seconds=np.full((2, 3), 4e-3),
                     target_tokens=[1, 2, 3, 4, 5, 6, 7],
                     target_seconds=np.array([[20, 24, 27, 29, 31, 33, 35], [30, 34, 37, 40, 42, 44, 46]]) * 1e-3,
                     feature_seconds={"target_only": 1e-5})
    tree = {"tables": 0.8, "step": 0.15, "forward": 0.04, "node": 0.02}
    chain = {"tables": 1.05, "step": 0.1, "node": 0.01}
    shapes = [Action(2, 0, 1), Action(3, 0, 1), Action(1, 2, 0), Action(1, 3, 0), Action(2, 1, 2), Action(3, 1, 1),
              Action(1, 1, 1)]
    priced = dataclasses.replace(m, step_ratios=StepRatios(tree=tree, chain=chain))
    truth = {"plain": 1.0, **{f"traversal:{a}": float(pricing.step_ratio(priced, [30], [a])[0, 0]) for a in shapes},
             **{f"lookup:{n}": float(pricing.lookup_seconds(priced, [30], [n])[0, 0] / priced.t_p(30, 1))
                for n in (1, 2, 4)}}
    ratios, by_class = fit_step_ratios(_timed(m, truth, lambda rnd, slot: (1.0, 1.5)[rnd] * (1 + 0.01 * slot)), m)
    for k, v in tree.items():
        assert ratios.tree[k] == pytest.approx(v, abs=0.02), k
    for k, v in chain.items():
        assert ratios.chain[k] == pytest.approx(v, abs=0.02), k
    for key, want in truth.items():
        assert by_class[key]["ratio"] == pytest.approx(want, rel=0.01), key
        if key != "plain":
            assert by_class[key]["fitted_ratio"] == pytest.approx(want, rel=0.01), key
    # normalised by the round's mean plain step instead, the drift would have moved a class by its slot's distance
    # from the middle of the round; by each round's plain steps alone, the slow round would read 1.25x for all


def test_quiet_seconds_reads_the_quietest_block_not_the_load(monkeypatch):
    """Deciding's price must not move with load (issue #43): on a scripted clock where another process slows most
    calls 3x and adds spikes, the quietest block's median reads the quiet call; their mean reads 3x it."""
    import decoding.latency as latency

    durations = iter([1e-3] * 3 + [3e-3] * 120 + [1e-3, 1e-3, 9e-3] * 13 + [1e-3] + [3e-3] * 40)  # warm-up, busy, quiet
    clock = [0.0]
    monkeypatch.setattr(latency.time, "perf_counter", lambda: clock[0])

    def call():
        clock[0] += next(durations)

    assert latency.quiet_seconds(call, reps=200, blocks=5) == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="reps >= 1"):
        latency.quiet_seconds(call, reps=0)


def test_time_deciding_times_every_feature_set_on_a_real_root(pair, one_thread):
    from data_collection.step_prices import time_deciding
    from decoding.features import FEATURE_SETS

    target, draft = pair
    m = profile_pair(TimedPair(target, draft, VOCAB), list(range(3, 40)), Grid([4, 16], [1, 2, 3], [1, 2, 5], 2, 1))
    seconds = time_deciding(TimedPair(target, draft, VOCAB), list(range(3, 20)), m, reps=10)
    assert set(seconds) == set(FEATURE_SETS) and all(0 < v < 1 for v in seconds.values())
    priced = dataclasses.replace(m, feature_seconds=seconds)
    decided = pricing.step_seconds(priced, [10], [Action(2, 0, 1)], features="target_only", inference_seconds=1e-4)
    assert decided[0, 0] == pytest.approx(pricing.step_seconds(priced, [10], [Action(2, 0, 1)])[0, 0]
                                          + seconds["target_only"] + 1e-4)


def test_time_grid_leaves_caches_at_each_context_and_keeps_raw_repeats(pair, one_thread):
    target, draft = pair
    grid = time_grid(TimedPair(target, draft, VOCAB), [5, 6, 7], Grid([3, 8], [1, 4], [1, 3], repeats=3, warmup=0))
    assert grid.draft.shape == (2, 2, 3) and grid.target.shape == (2, 2, 3) and np.all(grid.draft > 0)


def test_step_times_keeps_train_drafts_metric_keys(pair, one_thread):
    target, draft = pair
    out = step_times(TimedPair(target, draft, VOCAB), tile_ids([4, 5, 6], 20), reps=3, warmup=1)
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
        draft_tree(DraftRoot(kv, q_root), action, DraftRule(Sampling(), VOCAB), np.random.default_rng(0))
    _, rel, rows = draft_forwards([action])
    assert calls == list(zip((l + rel).tolist(), rows.tolist(), strict=True))


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
        f"  warmup: 1\n  feature_repeats: 2\n  price_rounds: 2\n  price_tokens: 3\n  price_contexts: [6, 10]\n"
        f"  lookup_lengths: [1, 2]\n  out: {tmp_path / 'latency.json'}\n")
    return path


@pytest.mark.parametrize("draft", ["hf", "self_draft", "eagle"])
def test_profile_stage_writes_the_latency_model(tiny_params, tmp_path, draft, capsys, one_thread):
    from pipeline.cli import main

    extra = [] if draft == "hf" else ["--set", f"model.draft={draft}:{tmp_path / 'not_built'}"]
    assert main(["profile", "--params", str(tiny_params), "--no-progress", *extra]) == 0
    m = LatencyModel.load(tmp_path / "latency.json")
    assert m.contexts.tolist() == [4, 12] and m.target_tokens.tolist() == [1, 2, 4]
    assert m.meta["threads"] == 1 and m.meta["target"].startswith("hf:")
    # every speculative action of the grid (K 1-2, L1 0-1, L2 0-1) and each lookup length is decoded against plain
    # steps; deciding's features are timed for every feature set the pair can feed
    by_class = m.meta["step_ratios_by_class"]
    space = list(ActionSpace([1, 2], [0, 1], [0, 1]))
    assert set(by_class) == {"plain", "lookup:1", "lookup:2", *(f"traversal:{a}" for a in space if a.tree_size)}
    assert all("fitted_ratio" in by_class[k] for k in by_class if k != "plain")
    assert set(m.feature_seconds) == {"target_only", "paper"}
    # every method's verify call on every tree of the action grid it supports (chain-only methods: chains)
    trees = {str(a) for a in space if a.tree_size}
    assert set(m.verify_seconds["traversal"]) == set(m.verify_seconds["gbv"]) == trees
    assert set(m.verify_seconds["naive"]) == {str(a) for a in space if a.tree_size and a.is_chain} != trees
    assert np.all(np.isfinite(pricing.verify_offset(m, "gbv", space)))
    if draft != "hf":  # the trained draft is not built yet: an untrained one of the configured kind and shape
        assert m.meta["draft_timed"].startswith(f"untrained {draft}") and "not_built" in m.meta["draft"]
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


class _ColdClock:
    """A fake ``time`` for `forward_tables`: an operation costs 1 unit, 10 more when the one before it was of the
    other kind (draft after target or target after draft: a cold cache)."""

    def __init__(self):
        self.t, self.last = 0.0, None

    def perf_counter(self):
        return self.t

    def op(self, kind):
        self.t += 1.0 + (10.0 if self.last not in (None, kind) else 0.0)
        self.last = kind


@pytest.mark.parametrize("prime", [True, False])
def test_each_cell_is_timed_after_a_call_of_its_own_operation(pair, one_thread, monkeypatch, prime):
    """The first cell of each kind in a round follows the other kind's calls; unprimed, it alone paid that switch
    (stop 61: the 1-row draft cell read 8.0 ms against 3.1 for 2 rows, the 1-token pass 50 vs 38 ms at 2 tokens)."""
    from data_collection import forward_tables as ft

    clock = _ColdClock()
    monkeypatch.setattr(ft, "time", clock)
    monkeypatch.setattr(ft, "target_pass", lambda kv, *a: clock.op("target"))
    monkeypatch.setattr(ft, "draft_step", lambda kv, *a: clock.op("draft"))
    target, draft = pair
    grid = time_grid(TimedPair(target, draft, VOCAB), [5, 6, 7],
                     Grid([3, 8], [1, 2], [1, 2, 3], repeats=2, warmup=1, prime=prime))
    if prime:
        assert np.all(grid.draft == 1.0) and np.all(grid.target == 1.0)
    else:  # the first cell of each kind paid the switch, the others did not
        assert np.all(grid.draft[:, 0] == 11.0) and np.all(grid.target[:, 0] == 11.0)
        assert np.all(grid.draft[:, 1:] == 1.0) and np.all(grid.target[:, 1:] == 1.0)
