"""The evaluate stage's policy arithmetic (evaluation/online.py) on hand-made labels and runs."""

from __future__ import annotations

import numpy as np
import pytest

from data_collection.offline_table import OfflineTable
from decoding.actions import Action, ActionSpace
from evaluation.online import CHAIN_STATIC, best_statics, chosen, depth_acceptance, offline_tps

SPACE = ActionSpace(range(1, 3), range(0, 2), range(0, 2))  # (1,0,0) (1,0,1) (1,1,0) (1,1,1) (2,0,0) ...


def _labels():
    T = np.tile([1.0 + a.tree_size * 0.5 for a in SPACE], (4, 1))  # seconds grow with the tree
    E = np.tile([1.0 + 0.2 * a.tree_size + (0.8 if a == Action(2, 1, 1) else 0.0) for a in SPACE], (4, 1))
    E[:, [i for i, a in enumerate(SPACE) if a.L2 == 0]] = np.tile(
        [1.0 + 0.2 * a.L1 for a in SPACE if a.L2 == 0], (4, 1))
    return {"specinfer": E, "traversal": E + 0.01}, {m: T for m in ("specinfer", "traversal", "naive")}


def table(labels, T):
    n = next(iter(T.values())).shape[0]
    return OfflineTable(SPACE, labels, T, {"split": np.array(["test"] * n)})


def test_best_statics_speculate_and_the_chain_stays_a_chain():
    labels, T = _labels()
    st = best_statics(table(labels, T), ["traversal", "specinfer"])
    # E/T: every tree loses to autoregressive (at best 2.4 / 2.5 < 1), yet a static policy must speculate
    assert all(SPACE[a].tree_size > 0 for _, a in st.values())
    assert st["static:specinfer"] == ("specinfer", SPACE.index(Action(2, 1, 1)))  # its +0.8 wins among trees
    method, a = st[CHAIN_STATIC]
    assert method == "naive" and SPACE[a].is_chain and SPACE[a].tree_size > 0
    assert CHAIN_STATIC not in best_statics(table(labels, T), ["traversal"], chain=False)
    assert CHAIN_STATIC not in best_statics(table({"traversal": labels["traversal"]}, T), ["traversal"])  # no OT labels


def test_a_method_that_verifies_slowly_is_priced_so():
    """Each method's statics are priced as its own steps: a costly branching verify moves it off the branching tree,
    and its TPS falls by exactly that price."""
    labels, T = _labels()
    tree = SPACE.index(Action(2, 1, 1))
    slow = np.array([1.0 if a.K > 1 and a.tree_size else 0.0 for a in SPACE])  # +1 s per branching tree
    priced_T = {**T, "specinfer": T["specinfer"] + slow[None, :]}
    plain = best_statics(table(labels, T), ["specinfer", "traversal"])
    priced = best_statics(table(labels, priced_T), ["specinfer", "traversal"])
    assert plain["static:specinfer"][1] == tree and SPACE[priced["static:specinfer"][1]].K == 1
    assert priced["static:traversal"] == plain["static:traversal"]  # its own prices: as before
    fixed = {"static:specinfer": ("specinfer", tree)}
    a, b = (offline_tps(table(labels, t), fixed)["static:specinfer"]["tps"] for t in (T, priced_T))
    assert a == pytest.approx(labels["specinfer"][0, tree] / T["specinfer"][0, tree])
    assert b == pytest.approx(labels["specinfer"][0, tree] / (T["specinfer"][0, tree] + 1.0))


def test_offline_tps_is_labels_over_seconds_and_relative_to_autoregressive():
    labels, T = _labels()
    st = best_statics(table(labels, T), ["specinfer"])
    off = offline_tps(table(labels, T), st)
    assert off["autoregressive"]["tps"] == pytest.approx(1.0)  # E = 1 per step of 1 s
    a = SPACE.index(Action(2, 1, 1))
    assert off["static:specinfer"]["tps"] == pytest.approx(labels["specinfer"][0, a] / T["specinfer"][0, a])
    assert off["static:specinfer"]["vs_autoregressive"] == pytest.approx(off["static:specinfer"]["tps"])
    assert off["static:specinfer"]["action"] == "2,1,1"
    assert offline_tps(table(labels, T).rows(np.zeros(4, bool)), st) == {}


def test_depth_acceptance_and_chosen_pool_the_runs_of_a_policy():
    runs = [{"policy": "a", "depth_offered": [0, 4, 2], "depth_accepted": [0, 2, 1], "choices": {"x:1,1,1": 3}},
            {"policy": "a", "depth_offered": [0, 4], "depth_accepted": [0, 1], "choices": {"autoregressive": 1}},
            {"policy": "b", "depth_offered": [0, 2], "depth_accepted": [0, 2], "choices": {}}]
    acc = depth_acceptance(runs)
    assert acc["a"] == pytest.approx([3 / 8, 1 / 2]) and acc["b"] == pytest.approx([1.0])
    assert chosen(runs, "a") == {"x:1,1,1": 0.75, "autoregressive": 0.25} and chosen(runs, "b") == {}


def test_autoregressive_would_win_these_labels():
    """The premise of the first test: on these labels the unrestricted best static is the empty tree."""
    from evaluation.online import throughput

    labels, T = _labels()
    assert SPACE[throughput.best_static(labels["specinfer"], T["specinfer"])].tree_size == 0


def test_best_static_by_group_chooses_on_each_groups_fit_roots():
    # action 0 wins at T=1, action 1 at T=0.6; T=0 has no fit roots and gets the fallback
    E = np.array([[3.0, 1.0], [3.0, 1.0], [1.0, 3.0]])
    T = np.ones_like(E)
    keys = np.array(["T=1", "T=1", "T=0.6"])
    from decoding import throughput

    got = throughput.best_static_by_group(E, T, keys, np.array(["T=1", "T=0.6", "T=0"]), fallback=7)
    assert got == {"T=1": 0, "T=0.6": 1, "T=0": 7}


def test_the_best_static_is_autoregressive_where_no_speculating_static_beats_it():
    from evaluation.online import AUTOREGRESSIVE, best_static_name

    fit = {AUTOREGRESSIVE: {"tps": 10.0}, "static:traversal": {"tps": 9.2}, "static:naive_tree": {"tps": 9.5}}
    assert best_static_name(fit) == AUTOREGRESSIVE  # the headline's "best static" is then autoregressive itself
    fit["static:traversal"]["tps"] = 10.4
    assert best_static_name(fit) == "static:traversal"
    assert best_static_name({}) is None


def test_deciding_counts_the_choose_time_of_decided_steps_only():
    """The pricing audit's deciding line compares the decoder's choose time with its price over the steps the
    selector decided: a lookup step's choose time (the proposal's tree) and a static step are not deciding."""
    from types import SimpleNamespace

    from selector_helpers import toy_latency

    from decoding import pricing
    from decoding.policy import StepResult, StepTiming
    from evaluation.online import deciding

    def step(action, choose, selected=True, proposed=False):
        return StepResult(action, "traversal", [0], None, 64, StepTiming(0.05, 0.01, 0.03, 0.0, choose), proposed,
                          selected)

    latency, policy = toy_latency(), SimpleNamespace(features="target_only", inference_seconds=1e-4)
    steps = [step(Action(2, 1, 1), 0.002), step(Action(1, 3, 0), 0.007, proposed=True),
             step(Action(1, 0, 0), 0.003), step(Action(1, 1, 0), 0.0, selected=False)]
    n, measured, modelled = deciding(steps, policy, latency)
    assert n == 2 and measured == pytest.approx(0.005)
    assert modelled == pytest.approx(sum(float(pricing.decide_seconds(latency, [64], [a], "target_only", 1e-4)[0, 0])
                                         for a in (Action(2, 1, 1), Action(1, 0, 0))))
    assert deciding(steps, SimpleNamespace(features=None, inference_seconds=0.0), latency) is None
