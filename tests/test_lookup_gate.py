"""The learned lookup decision (decoding/lookup_gate.py, data_collection/lookup_labels.py): the longest-repeat
proposal against a brute force, the label formula against exact enumeration, the gate's fit, its file and errors,
the policy's decisions, its decoding (greedy equals autoregressive), and the labels against plain causal forwards."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from engine_helpers import VOCAB, untied_pair
from selector_helpers import toy_latency

from decoding.actions import AR_ACTION, AUTOREGRESSIVE, Action
from decoding.engine import SpeculativeDecoder
from decoding.exact import TablePair, exact_block_efficiency, tree_p_rows
from decoding.lookup import LOOKUP_TAG, lookup_tree
from decoding.lookup_gate import (
    ENTROPY_EDGES,
    RUN_EDGES,
    LearnedLookup,
    LookupGate,
    LookupGateError,
    Repeat,
    chain_block_efficiency,
    longest_repeat,
    lookup_step_seconds,
)
from decoding.policy import Choice, RootFeatures, StaticPolicy, StepTiming
from decoding.sampling import Sampling

# ---------------------------------------------------------------- the proposal


def test_the_longest_repeat_wins_over_a_more_recent_shorter_one():
    #          0  1  2  3  4  5  6  7
    context = [9, 7, 4, 5, 7, 3, 9, 7]  # root 7: at 1 after 9 (run 2, as the context ends 9, 7), at 4 after 5 (run 1)
    assert longest_repeat(context, 3) == Repeat((4, 5, 7), 2)
    assert longest_repeat([1, 2, 1, 3, 1], 2) == Repeat((3, 1), 1)  # equal runs: the most recent
    assert longest_repeat([1, 2, 3], 4) is None and longest_repeat([4], 4) is None
    assert longest_repeat([5, 6, 7, 1, 5, 6, 7], 8, cap=2) == Repeat((1, 5, 6, 7), 2)  # the run is capped


def _brute_force(ids: list[int], length: int, cap: int) -> Repeat | None:
    n, best = len(ids), None
    for end in range(n - 1):
        if ids[end] != ids[-1]:
            continue
        run = 1
        while run < cap and end - run >= 0 and ids[end - run] == ids[n - 1 - run]:
            run += 1
        if best is None or run >= best[0]:
            best = (run, end)
    return None if best is None else Repeat(tuple(ids[best[1] + 1: best[1] + 1 + length]), best[0])


@pytest.mark.parametrize("seed", range(6))
def test_longest_repeat_agrees_with_a_brute_force(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        ids = rng.integers(0, 3 + seed, size=int(rng.integers(1, 40))).tolist()
        for cap in (1, 3, 64):
            assert longest_repeat(ids, 5, cap) == _brute_force(ids, 5, cap)


# ---------------------------------------------------------------- labels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_chain_formula_is_the_exact_block_efficiency_of_naive(seed):
    pair, context = TablePair(4, seed), (0, 1, 2)
    tokens = [3, 0, 2]
    for n in (1, 2, 3):
        tree = lookup_tree(tokens[:n], pair.vocab_size)
        p = tree_p_rows(tree, pair, context)
        accept = np.array([p[i, tokens[i]] for i in range(n)] + [np.nan] * (3 - n))
        assert chain_block_efficiency(accept)[n - 1] == pytest.approx(exact_block_efficiency(tree, p, "naive"), abs=1e-12)
        # past the proposal's end the value stays
        assert chain_block_efficiency(accept)[-1] == pytest.approx(chain_block_efficiency(accept)[n - 1])


# ---------------------------------------------------------------- the gate


def _synthetic(n_roots: int = 400, seed: int = 0):
    """Long runs are accepted (0.9 per token), one-token runs are not (0.1); some proposals end early."""
    rng = np.random.default_rng(seed)
    run = rng.choice([1, 12], size=n_roots)
    h = rng.uniform(0, 3, size=n_roots)
    accept = np.where(run[:, None] > 1, 0.9, 0.1) * np.ones((n_roots, 4))
    accept[: n_roots // 4, 2:] = np.nan
    return run, h, accept


def test_the_gate_learns_where_lookups_pay_and_shrinks_empty_cells():
    run, h, accept = _synthetic()
    gate = LookupGate.fit(run, h, accept, prior=5.0)
    long_, short = gate.predict(12, 1.5), gate.predict(1, 1.5)
    assert long_[0] == pytest.approx(1.9, abs=0.02) and short[0] == pytest.approx(1.1, abs=0.02)
    assert np.all(np.diff(long_) > 0.3) and long_[3] > 3.0
    assert gate.counts.sum() == run.size
    # a run bin never seen takes the overall mean (between the two)
    unseen = gate.predict(3, 0.1)
    assert short[0] < unseen[0] < long_[0]


def test_the_gate_round_trips_and_rejects_bad_files(tmp_path):
    gate = LookupGate.fit(*_synthetic())
    path = tmp_path / "gate.json"
    path.write_text(json.dumps(gate.to_dict()))
    again = LookupGate.load(path)
    assert np.allclose(again.table, gate.table, atol=1e-6) and again.max_length == 4 and again.step_ratio is None
    timed = LookupGate.fit(*_synthetic(), step_ratio=np.array([1.0, 1.1, 1.2, 1.4]))
    assert LookupGate.from_dict(timed.to_dict()).step_ratio.tolist() == [1.0, 1.1, 1.2, 1.4]
    with pytest.raises(LookupGateError, match="step_ratio"):
        LookupGate.from_dict({**timed.to_dict(), "step_ratio": [1.0, -1.0, 1.0, 1.0]})
    d = gate.to_dict()
    with pytest.raises(LookupGateError, match="not a lookup gate"):
        LookupGate.from_dict({**d, "kind": "selector"})
    with pytest.raises(LookupGateError, match="bins"):
        LookupGate.from_dict({**d, "run_edges": [2, 3]})
    with pytest.raises(LookupGateError, match="shape"):
        LookupGate.from_dict({**d, "table": np.ones((2, 2, 4)).tolist()})
    bad = np.array(d["table"])
    bad[0, 0, 0] = np.nan
    with pytest.raises(LookupGateError, match="finite"):
        LookupGate.from_dict({**d, "table": bad.tolist()})
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(LookupGateError, match="not JSON"):
        LookupGate.load(tmp_path / "broken.json")
    with pytest.raises(LookupGateError, match="no lookup gate"):
        LookupGate.load(tmp_path / "missing.json")
    with pytest.raises(LookupGateError, match="runs >= 1"):
        LookupGate.fit(np.array([0]), np.array([0.5]), np.ones((1, 2)))


def test_lookup_steps_are_priced_without_draft_forwards():
    lat = toy_latency()
    t = lookup_step_seconds(lat, [100, 200], 3)
    want = lat.t_p(100.0, 3.0) + lat.step_overhead["plain"] + 2 * lat.step_overhead["per_node"]
    assert t.shape == (2, 3) and t[0, 1] == pytest.approx(want)
    assert np.all(np.diff(t, axis=1) > 0)  # a longer chain costs more
    assert lookup_step_seconds(lat, [100], 3, "target_only")[0, 0] == pytest.approx(t[0, 0] + lat.feature_seconds)
    # measured ratios: the model's plain step times each
    plain = lat.step_seconds_at([100.0], [AR_ACTION])[0, 0]
    assert lookup_step_seconds(lat, [100], 3, None, np.array([1.1, 1.2, 1.5, 9.9])) == pytest.approx(
        plain * np.array([[1.1, 1.2, 1.5]]))


def test_measured_step_ratios_on_a_tiny_target():
    from data_collection.lookup_labels import lookup_step_ratios

    target, _ = untied_pair(0)
    line, measured = lookup_step_ratios(target, VOCAB, list(range(3, 40)), 3, [Sampling(1.0), Sampling(0.6, 0.9)],
                                        rounds=2, steps=3)
    assert line.shape == measured.shape == (3,) and np.all(np.isfinite(measured) & (measured > 0))
    assert np.allclose(np.diff(line), line[1] - line[0])  # a line through the measured ratios
    assert line.mean() == pytest.approx(measured.mean(), rel=1e-9)


# ---------------------------------------------------------------- the policy


def _flat_gate(value: float, n: int = 4) -> LookupGate:
    shape = (len(RUN_EDGES) + 1, len(ENTROPY_EDGES) + 1)
    return LookupGate(np.full((*shape, n), value) + np.arange(n) * (value - 1.0), np.zeros(shape, dtype=int))


class _Fallback:
    """A selector whose best predicted rate is fixed."""

    def __init__(self, rate: float) -> None:
        self.rate, self.asked, self.observed = rate, 0, []
        self.feature_set = "target_only"

    def best(self, features):
        self.asked += 1
        return Choice(Action(2, 0, 1), "specinfer"), self.rate

    def select(self, features):
        return self.best(features)[0]

    def observe_step(self, action, context_length, timing):
        self.observed.append(action)


def _root(context: list[int]) -> RootFeatures:
    p = np.full(VOCAB, 1.0 / VOCAB)
    return RootFeatures(len(context) - 1, Sampling(1.0), p, context=context)


def test_the_policy_weighs_the_lookup_chain_against_the_fallback():
    context = [5, 6, 7, 1, 2, 3, 4, 5, 6, 7]  # root 7 repeats with run 3: proposes 1, 2, 3, 4
    lat = toy_latency()
    look = lookup_step_seconds(lat, [len(context) - 1], 4)[0]
    gate = _flat_gate(1.9)  # Ê(n) = 1.9, 2.8, 3.7, 4.6: the rate grows with n on this latency
    cheap = _Fallback(rate=0.5 * float((gate.predict(3, 0.0) / look).max()))
    choice = LearnedLookup(gate, lat, cheap).select(_root(context))
    assert choice.proposal == (1, 2, 3, 4) and choice.action == Action(1, 4, 0) and choice.method == "naive"
    strong = _Fallback(rate=2.0 * float((gate.predict(3, 0.0) / look).max()))
    policy = LearnedLookup(gate, lat, strong)
    assert policy.select(_root(context)) == Choice(Action(2, 0, 1), "specinfer")
    # no repeat: the fallback alone decides (and is told about its step)
    assert policy.select(_root([1, 2, 3])) == Choice(Action(2, 0, 1), "specinfer")
    policy.observe_step(Action(2, 0, 1), 3, StepTiming(0.2, 0.1, 0.1))
    policy.observe_step(Action(1, 4, 0), 3, StepTiming(0.1, 0.0, 0.1, lookup=True))  # a lookup step: not its own
    assert strong.observed == [Action(2, 0, 1)]


def test_without_a_fallback_a_weak_lookup_takes_a_plain_step():
    lat = toy_latency()
    context = [5, 6, 7, 1, 2, 3, 4, 5, 6, 7]
    assert LearnedLookup(_flat_gate(1.0), lat).select(_root(context)) == Choice(AR_ACTION)  # Ê 1 at a higher cost
    assert LearnedLookup(_flat_gate(1.9), lat).select(_root(context)).proposal is not None
    with pytest.raises(TypeError, match="best"):
        LearnedLookup(_flat_gate(1.9), lat, StaticPolicy(Action(2, 0, 1)))


def test_greedy_decoding_with_the_learned_lookup_equals_autoregressive():
    target, draft = untied_pair(0)
    decoder = SpeculativeDecoder(target, draft, VOCAB)
    base = [3, 17, 42, 8, 23, 5, 61, 12]
    prompt = base + [30, 31] + base[:5]
    ar = decoder.generate(prompt, 40, AUTOREGRESSIVE, sampling=Sampling(0.0))
    got = decoder.generate(prompt, 40, "traversal", LearnedLookup(_flat_gate(1.9), toy_latency()), Sampling(0.0))
    assert got.tokens == ar.tokens
    assert sum(n for a, n in got.stats.actions.items() if a.endswith(LOOKUP_TAG)) >= 1


# ---------------------------------------------------------------- the labels on a model


@pytest.mark.parametrize("chunk", [512, 3])  # every chain in one forward; one chain per forward
def test_lookup_labels_equal_plain_causal_forwards(chunk, monkeypatch):
    import data_collection.lookup_labels as ll
    from data_collection.lookup_labels import lookup_labels
    from decoding.engine.torch_sampling import prob_rows

    monkeypatch.setattr(ll, "CHUNK_NODES", chunk)

    target, _ = untied_pair(0)
    base = [3, 17, 42, 8, 23, 5, 61, 12]
    seq = base + [30, 31] + base[:6] + [9, 4]
    positions = [4, 12, 14, 15]
    sampling = Sampling(0.8, 0.95)
    rows = lookup_labels(target, seq, positions, sampling, VOCAB, length=3)
    assert rows.position == positions
    for i, r in enumerate(positions):
        found = longest_repeat(seq[: r + 1], 3)
        if found is None:
            assert rows.run[i] == 0 and rows.proposed[i] == 0 and np.isnan(rows.accept[i]).all()
            continue
        assert rows.run[i] == found.run and rows.proposed[i] == len(found.tokens)
        ids = torch.tensor([seq[: r + 1] + list(found.tokens)])
        with torch.inference_mode():
            p = prob_rows(target(input_ids=ids).logits[0], sampling, VOCAB)
        want = [p[r + j, found.tokens[j]] for j in range(len(found.tokens))]
        assert np.allclose(rows.accept[i][: len(want)], want, atol=1e-5)
    assert any(run > 0 for run in rows.run) and any(run == 0 for run in rows.run)
