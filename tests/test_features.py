"""The feature schema (decoding/features.py) and the selector protocol (decoding/policy.py): numpy only,
hand-checked scalar values, and clear errors for features that do not match a schema."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from decoding.actions import Action
from decoding.features import (
    FEATURE_SETS,
    PROBABILITY_SCALARS,
    FeatureError,
    FeatureSchema,
    entropy,
    kl,
    probability_scalars,
)
from decoding.policy import RootFeatures, StaticPolicy, as_policy
from decoding.sampling import Sampling


class FakeLatency:
    """t_q = 1 ms + 1 us per context token, t_p = 10 ms + 10 us per context token."""

    def t_q(self, l, rows):  # noqa: E741 (l: context length, as in ALGORITHMS.md)
        return 1e-3 + 1e-6 * np.asarray(l, dtype=float)

    def t_p(self, l, tokens):  # noqa: E741
        return 1e-2 + 1e-5 * np.asarray(l, dtype=float)

    def root_step_seconds(self, l):  # noqa: E741 (LatencyModel's memoized one-row / one-token steps)
        return float(self.t_q(l, 1)), float(self.t_p(l, 1))


def test_torch_free_import_of_protocol_schema_and_latency():
    """The selector protocol, the feature schema, the sampling transform and the latency model import and
    work with torch, numba and scipy unimportable (what export/runtime.py relies on)."""
    code = textwrap.dedent("""
        import sys
        for name in ("torch", "numba", "scipy", "transformers"):
            sys.modules[name] = None
        import numpy as np
        from decoding.policy import RootFeatures, StaticPolicy
        from decoding.features import FeatureSchema
        from decoding.sampling import Sampling, transform_logits_np
        from decoding.actions import Action, ActionSpace
        import decoding.latency
        p = transform_logits_np(np.arange(8.0), Sampling(1.0))
        root = RootFeatures(5, Sampling(1.0), p, p[::-1].copy(), p, np.ones(4), np.ones(3), np.ones(3))
        class Lat:
            def t_q(self, l, rows): return 0.001
            def t_p(self, l, tokens): return 0.01
            def root_step_seconds(self, l): return 0.001, 0.01
        x = FeatureSchema.for_pair("paper", 4, 3).vectorize(root, Lat())
        assert x["scalars"].shape == (11,) and x["h_p_prev"].dtype == np.float32
        assert StaticPolicy(Action(1, 0, 0)).select(root) == Action(1, 0, 0)
        bad = [m for m in ("torch", "numba", "scipy", "transformers") if sys.modules.get(m) is not None]
        assert not bad, bad
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=".")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_scalars_by_hand():
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([0.25, 0.25, 0.5])
    assert entropy(p) == pytest.approx(np.log(2))
    assert kl(p, q) == pytest.approx(np.log(2))  # sum 0.5 log(0.5/0.25)
    # q puts mass where p is 0: KL(q || p) uses max(p, EPS) and stays finite
    assert np.isfinite(kl(q, p)) and kl(q, p) > 10
    s = probability_scalars(p, q, q)
    assert s.shape == (6,)
    np.testing.assert_allclose(s, [np.log(2), entropy(q), entropy(q), np.log(2), kl(q, p), 1.0])
    batch = probability_scalars(np.stack([p, q]), np.stack([q, p]), np.stack([q, q]))
    assert batch.shape == (2, 6) and batch[1, 3] == pytest.approx(kl(q, p))
    assert np.isnan(probability_scalars(p)[1:]).all()  # draft terms need q


def _root(**kw):
    p = np.array([0.7, 0.2, 0.1])
    base = dict(context_length=100, sampling=Sampling(0.6, 0.9), p_prev=p, q_prev=p[::-1].copy(), q_root=p,
                h_p_prev=np.arange(4.0), h_q_prev=np.zeros(2), h_q_root=np.ones(2), e_root=np.full(4, 0.5))
    base.update(kw)
    return RootFeatures(**base)


def test_vectorize_orders_scalars_as_the_schema():
    schema = FeatureSchema.for_pair("paper", 4, 2)
    x = schema.vectorize(_root(), FakeLatency())
    assert list(x) == ["h_p_prev", "h_q_prev", "h_q_root", "scalars"]
    s = dict(zip(schema.scalars, x["scalars"], strict=True))
    assert s["context_length"] == 100 and s["temperature"] == pytest.approx(0.6) and s["top_p"] == pytest.approx(0.9)
    assert s["draft_step_ms"] == pytest.approx(1.1) and s["target_step_ms"] == pytest.approx(11.0)
    assert s["entropy_p_prev"] == pytest.approx(entropy(np.array([0.7, 0.2, 0.1])), rel=1e-6)
    assert set(PROBABILITY_SCALARS) <= set(schema.scalars)


def test_target_only_needs_no_draft():
    schema = FeatureSchema.for_pair("target_only", 4, 2)
    assert not schema.needs_draft and FeatureSchema.for_pair("paper", 4, 2).needs_draft
    x = schema.vectorize(_root(q_prev=None, q_root=None, h_q_prev=None, h_q_root=None), FakeLatency())
    assert list(x) == ["h_p_prev", "e_root", "scalars"] and x["scalars"].shape == (len(FEATURE_SETS["target_only"]) - 2,)
    assert np.array_equal(x["e_root"], np.full(4, 0.5, np.float32))
    assert FeatureSchema.from_dict(schema.to_dict()) == schema
    with pytest.raises(FeatureError, match="e_root"):  # the root token's embedding is part of the target side
        schema.vectorize(_root(e_root=None), FakeLatency())


def test_memo_shares_the_entropy_of_p_prev_between_stages():
    """Two feature sets vectorized from the same root's memo compute H(p_prev) once, and the scalars equal a fresh
    computation."""
    first = _root(q_prev=None, q_root=None, h_q_prev=None, h_q_root=None)
    FeatureSchema.for_pair("target_only", 4, 2).vectorize(first, FakeLatency())
    assert first.memo["entropy_p_prev"] == pytest.approx(float(entropy(first.p_prev)))
    first.memo["entropy_p_prev"] = 123.0  # a planted value: stage 2 must read the memo, not recompute
    paper = FeatureSchema.for_pair("paper", 4, 2)
    second = _root(memo=first.memo)
    s = dict(zip(paper.scalars, paper.vectorize(second, FakeLatency())["scalars"], strict=True))
    assert s["entropy_p_prev"] == 123.0
    fresh = dict(zip(paper.scalars, paper.vectorize(_root(), FakeLatency())["scalars"], strict=True))
    assert fresh["entropy_p_prev"] == pytest.approx(float(entropy(first.p_prev)))
    assert all(fresh[k] == s[k] for k in paper.scalars if k != "entropy_p_prev")


def test_bad_features_fail_clearly():
    schema = FeatureSchema.for_pair("paper", 4, 2)
    with pytest.raises(FeatureError, match="h_q_prev"):
        schema.vectorize(_root(h_q_prev=None), FakeLatency())
    good = schema.vectorize(_root(), FakeLatency())
    with pytest.raises(FeatureError, match="missing .*h_q_root.*unexpected .*extra"):
        schema.validate({k: v for k, v in good.items() if k != "h_q_root"} | {"extra": np.zeros(1)})
    with pytest.raises(FeatureError, match="'h_p_prev': expected shape"):
        schema.validate(good | {"h_p_prev": np.zeros(5, np.float32)})
    nan = good["scalars"].copy()
    nan[schema.scalars.index("kl_q_p_prev")] = np.nan
    with pytest.raises(FeatureError, match="NaN.*kl_q_p_prev"):
        schema.validate(good | {"scalars": nan})
    with pytest.raises(FeatureError, match="p_prev"):
        schema.vectorize(_root(p_prev=None), FakeLatency())
    with pytest.raises(ValueError, match="unknown feature set"):
        FeatureSchema.for_pair("nope", 4, 2)


def test_policies():
    assert isinstance(as_policy(Action(2, 1, 1)), StaticPolicy)
    with pytest.raises(TypeError, match="decoding.policy.Policy"):
        as_policy("2,1,1")


def test_entropy_and_kl_equal_the_masked_definitions_bit_for_bit():
    """The fast forms (zero terms take log 1) sum exactly the terms of sum over p > 0 of p log p (q floored)."""
    from decoding.features import EPS

    rng = np.random.default_rng(3)
    rows = rng.dirichlet(np.full(4096, 0.05), size=3)  # many entries underflow to exactly 0
    rows[:, ::7] = 0.0
    rows /= rows.sum(axis=1, keepdims=True)
    p, q = rows[0], rows[1]
    with np.errstate(divide="ignore", invalid="ignore"):
        want_h = -np.where(rows > 0, rows * np.log(rows), 0.0).sum(axis=-1)
        want_kl = [np.where(a > 0, a * (np.log(a) - np.log(np.maximum(b, EPS))), 0.0).sum() for a, b in
                   ((p, q), (q, p), (p, p))]
    assert (rows == 0).any() and np.array_equal(entropy(rows), want_h) and entropy(p) == want_h[0]
    assert [kl(p, q), kl(q, p), kl(p, p)] == want_kl and np.isfinite(want_kl).all()


def test_one_root_entropy_is_shared_only_by_the_same_row_object():
    from decoding.features import probability_scalars

    p = np.full(8, 1 / 8)
    first = probability_scalars(p)[0]
    other = np.zeros(8)
    other[0] = 1.0
    assert first == pytest.approx(np.log(8)) and probability_scalars(other)[0] == 0.0  # a new row: recomputed
    assert probability_scalars(p)[0] == first
