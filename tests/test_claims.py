"""The findings of the evaluate stage (evaluation/claims.py) on hand-made label tables."""

from __future__ import annotations

import numpy as np
import pytest

from decoding.actions import Action, ActionSpace
from evaluation.claims import (
    claim_delay,
    claim_depth,
    claim_root_branching,
    depth_profile,
    families,
    findings,
    findings_summary,
    gbv_comparison,
    markdown,
)

SPACE = ActionSpace(range(1, 3), range(0, 3), range(0, 3))  # K 1-2, L1 0-2, L2 0-2
CHAIN_ACC = [0.9, 0.7, 0.5, 0.4]  # a_d of the chain (1,1,0), (1,2,0), (1,2,1), (1,2,2)
ROOT_ACC = [0.95, 0.6]  # a_d of (2,0,1), (2,0,2)


def _chain_E(acc) -> list[float]:
    """Ê of nested chains with per-depth acceptance ``acc``: 1 + sum_d prod_{k<=d} a_k."""
    return list(1 + np.cumsum(np.cumprod(acc)))


def table(n: int = 6, seed: int = 0, noise: float = 0.0) -> dict[str, np.ndarray]:
    """Labels where Traversal > GBV > SpecInfer > nss on branching trees and delayed > root at size 4."""
    base = np.full(len(SPACE), np.nan)
    e_chain = _chain_E(CHAIN_ACC)
    for a, e in zip([Action(1, 1, 0), Action(1, 2, 0), Action(1, 2, 1), Action(1, 2, 2)], e_chain, strict=True):
        base[SPACE.index(a)] = e
    base[SPACE.index(Action(1, 0, 0))] = 1.0
    base[SPACE.index(Action(1, 0, 1))] = e_chain[0]
    base[SPACE.index(Action(1, 0, 2))] = e_chain[1]
    base[SPACE.index(Action(1, 1, 1))] = e_chain[1]
    base[SPACE.index(Action(1, 1, 2))] = e_chain[2]
    for i, a in enumerate(SPACE):  # L2 = 0 labels do not depend on K
        if a.L2 == 0:
            base[i] = base[SPACE.index(Action(1, a.L1, 0))]
    root = _chain_E(ROOT_ACC)
    base[SPACE.index(Action(2, 0, 1))], base[SPACE.index(Action(2, 0, 2))] = root
    base[SPACE.index(Action(2, 1, 1))] = 2.4
    base[SPACE.index(Action(2, 1, 2))] = 2.9
    base[SPACE.index(Action(2, 2, 1))] = 2.6  # size 4, like (2,0,2) = 2.52
    base[SPACE.index(Action(2, 2, 2))] = 3.0
    branching = np.array([a.K > 1 and a.L2 > 0 for a in SPACE])
    rng = np.random.default_rng(seed)
    out = {}
    for m, scale in (("specinfer", 1.0), ("nss", 0.9), ("traversal", 1.1), ("gbv", 1.05)):
        E = np.where(branching, base * scale, base)
        out[m] = np.tile(E, (n, 1)) + noise * rng.normal(size=(n, len(SPACE)))
    return out


def test_families_of_the_space():
    fam = families(SPACE)
    assert [str(SPACE[i]) for i in fam["root_branching"]] == ["2,0,1", "2,0,2"]
    assert [str(SPACE[i]) for i in fam["delayed"]] == ["2,1,1", "2,1,2", "2,2,1", "2,2,2"]
    assert "1,0,0" not in [str(SPACE[i]) for i in fam["chains"]]  # the empty tree is no chain
    assert all(SPACE[i].K == 1 for i in fam["chains"]) and len(fam["chains"]) == 8


def test_claim1_holds_and_fails_where_an_ot_method_wins_one_action():
    labels = table()
    c = claim_root_branching(labels, SPACE)
    assert c["holds"] and c["per_method"]["specinfer"]["wins"] == 2
    assert c["mean_gain_over_best_ot"] == pytest.approx(0.1)
    labels["specinfer"][:, SPACE.index(Action(2, 0, 2))] *= 1.2  # now above traversal (x 1.1)
    c = claim_root_branching(labels, SPACE)
    assert not c["holds"] and c["per_method"]["specinfer"]["wins"] == 1
    assert c["per_method"]["specinfer"]["losses"] == 1
    assert c["per_method"]["specinfer"]["worst_action"] == "2,0,2"
    assert c["per_method"]["nss"]["wins"] == 2
    labels = table()
    labels["traversal"] = labels["specinfer"].copy()  # equal everywhere: ties, no win
    c = claim_root_branching(labels, SPACE)
    assert c["per_method"]["specinfer"]["ties"] == 2 and not c["holds"]


def test_claim2_compares_matched_tree_sizes():
    labels = table()
    c = claim_delay(labels, SPACE)
    assert c["holds"] and c["per_method"]["specinfer"]["sizes"] == [4]
    assert c["per_method"]["specinfer"]["by_size"]["4"]["delayed"] == "2,2,1"
    assert c["per_method"]["specinfer"]["mean_gain"] == pytest.approx(2.6 / _chain_E(ROOT_ACC)[1] - 1)
    labels["nss"][:, SPACE.index(Action(2, 2, 1))] = 1.5
    assert not claim_delay(labels, SPACE)["holds"]


def test_depth_profile_recovers_the_acceptance_rates():
    labels = table(noise=0.0)
    np.testing.assert_allclose(depth_profile(labels["specinfer"], SPACE, 1), CHAIN_ACC)
    np.testing.assert_allclose(depth_profile(labels["specinfer"], SPACE, 2), ROOT_ACC)
    c = claim_depth(labels, SPACE, tv_prev=np.array([0.1, 0.3]))
    assert c["holds"] and c["chain_method"] == "specinfer" and c["tv_prev_mean"] == pytest.approx(0.2)
    np.testing.assert_allclose(c["chain_divergence_tv"], 1 - np.array(CHAIN_ACC))


def test_claim3_fails_when_acceptance_rises_with_depth():
    labels = table()
    rising = _chain_E([0.5, 0.6, 0.7, 0.8])
    for m in labels:
        for a, e in zip([Action(1, 1, 0), Action(1, 2, 0), Action(1, 2, 1), Action(1, 2, 2)], rising, strict=True):
            labels[m][:, SPACE.index(a)] = e
    c = claim_depth(labels, SPACE)
    assert not c["falls_chain"] and not c["holds"]
    assert all(c["falls_root_branching"].values())


def test_gbv_comparison_per_family_and_temperature():
    labels = table(n=4)
    temps = np.array([0.6, 0.6, 1.0, 1.0])
    g = gbv_comparison(labels, SPACE, temps)
    rb = g["families"]["root_branching"]
    assert set(rb) == {"all", "T=0.6", "T=1"} and rb["T=0.6"]["roots"] == 2
    assert rb["all"]["gbv_vs_traversal"] == pytest.approx(1.05 / 1.1 - 1)
    assert rb["all"]["gbv_vs_specinfer"] == pytest.approx(0.05)
    assert g["chain_max_abs_diff_gbv_traversal"] == 0.0
    assert g["families"]["chains"]["all"]["gbv_vs_traversal"] == pytest.approx(0.0)
    # GBV (K = 2) vs BV on the K = 1 chain of the same depths, action by action
    want = []
    for a in [Action(2, 0, 1), Action(2, 0, 2), Action(2, 1, 1), Action(2, 1, 2), Action(2, 2, 1), Action(2, 2, 2)]:
        want.append(labels["gbv"][0, SPACE.index(a)] / labels["traversal"][0, SPACE.index(Action(1, a.L1, a.L2))] - 1)
    assert g["gbv_vs_bv_same_depth"] == pytest.approx(np.mean(want))
    assert not gbv_comparison({"traversal": labels["traversal"]}, SPACE, temps)["testable"]


def test_findings_and_markdown():
    f = findings(table(noise=0.01), SPACE, np.array([0.6, 1.0] * 3))
    text = markdown(f)
    assert "1. **Traversal beats every OT method at root branching: holds.**" in text
    assert "2. **Delaying the branch point" in text and "3. **OT acceptance" in text
    assert "| root_branching | T=0.6 | 3 |" in text
    h = findings_summary(f)
    assert h["claim1_holds"] == 1.0 and h["gbv_vs_traversal_root_branching"] == pytest.approx(1.05 / 1.1 - 1, abs=0.02)


def test_findings_with_a_chain_only_method_warn_nothing():
    """Actions a method never labelled (e.g. bv on branching trees) have NaN means, with no
    "Mean of empty slice" RuntimeWarning (evaluate printed one per run)."""
    import warnings

    labels = table()
    branching = np.array([a.K > 1 and a.L2 > 0 for a in SPACE])
    labels["gbv"] = np.where(branching & (np.arange(len(SPACE)) % 2 == 0), np.nan, labels["gbv"])  # never labelled
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        f = findings(labels, SPACE, np.array([0.6, 1.0] * 3))
    assert f["roots"] == 6
