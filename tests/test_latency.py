"""The latency model T(c, a) (decoding/latency.py): interpolation, pricing of a step, persistence, errors."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from decoding.actions import Action, ActionSpace
from decoding.latency import BlockMemo, LatencyModel, LatencyProfileError, draft_forwards

ROOT = Path(__file__).resolve().parents[1]


def toy(**changes) -> LatencyModel:
    """Tables linear in context (so interpolation between and beyond grid points is exact to check):
    t_q(c, r) = r + c / 100 ms, t_p(c, n) = base(n) + c / 10 ms, base non-monotonic (16 < 8)."""
    contexts = np.array([100.0, 200.0, 400.0])
    rows = np.array([1, 2, 3])
    tokens = np.array([1, 2, 4, 8, 16])
    base = np.array([10.0, 11.0, 13.0, 20.0, 18.0])
    d = {"contexts": contexts, "draft_rows": rows,
         "draft_seconds": 1e-3 * (rows[None, :] + contexts[:, None] / 100),
         "target_tokens": tokens, "target_seconds": 1e-3 * (base[None, :] + contexts[:, None] / 10),
         "feature_seconds": 0.5e-3, "meta": {"machine": "test"}}
    d.update(changes)
    return LatencyModel(**d)


def tq(c, r):  # the toy's draft step, seconds
    return 1e-3 * (r + c / 100)


def tp(c, n):  # the toy's target pass at the grid's token counts, seconds
    return 1e-3 * ({1: 10.0, 2: 11.0, 4: 13.0, 8: 20.0, 16: 18.0}[n] + c / 10)


def test_exact_at_every_grid_point():
    m = toy()
    for i, c in enumerate(m.contexts):
        for j, r in enumerate(m.draft_rows):
            assert m.t_q(c, r) == m.draft_seconds[i, j]
        for j, n in enumerate(m.target_tokens):
            assert m.t_p(c, n) == m.target_seconds[i, j]


def test_linear_between_grid_points_in_context_and_count():
    m = toy()
    assert m.t_q(150, 2) == pytest.approx(tq(150, 2), rel=1e-12)
    assert m.t_q(300, 1) == pytest.approx(tq(300, 1), rel=1e-12)
    assert m.t_p(100, 3) == pytest.approx((tp(100, 2) + tp(100, 4)) / 2, rel=1e-12)  # 12 + 10 ms
    assert m.t_p(250, 6) == pytest.approx((tp(250, 4) + tp(250, 8)) / 2, rel=1e-12)
    # arrays broadcast
    np.testing.assert_allclose(m.t_q(np.array([100, 150, 400]), 2), [tq(100, 2), tq(150, 2), tq(400, 2)], rtol=1e-12)


def test_non_monotone_measurements_are_kept():
    m = toy()
    assert m.t_p(200, 16) < m.t_p(200, 8)  # as measured: 16 tokens cheaper than 8
    assert m.t_p(200, 16) == pytest.approx(tp(200, 16))
    assert m.t_p(200, 12) == pytest.approx((tp(200, 8) + tp(200, 16)) / 2)


def test_linear_extrapolation_in_context_clamped_at_the_smallest_measurement():
    m = toy()
    assert m.t_q(800, 3) == pytest.approx(tq(800, 3), rel=1e-12)  # beyond the grid: end segment extended
    assert m.t_p(800, 4) == pytest.approx(tp(800, 4), rel=1e-12)
    assert m.t_p(50, 4) == pytest.approx(tp(100, 4), rel=1e-12)  # below the grid: clamped at the minimum
    # a table falling with context would extrapolate below anything measured: clamped per count
    falling = toy(draft_seconds=1e-3 * np.array([[3.0, 4, 5], [2, 3, 4], [1.5, 2.5, 3.5]]))
    assert falling.t_q(100_000, 1) == pytest.approx(1.5e-3)
    assert falling.t_q(300, 1) == pytest.approx(1.75e-3)


def test_counts_outside_the_profiled_range_are_an_error():
    m = toy()
    with pytest.raises(ValueError, match="profile.target_tokens"):
        m.t_p(100, 17)
    with pytest.raises(ValueError, match="profile.draft_rows"):
        m.t_q(100, 4)


def test_step_seconds_hand_computed():
    m = toy()
    l = 100  # noqa: E741
    actions = [Action(1, 0, 0), Action(4, 0, 0), Action(1, 3, 0), Action(2, 0, 2), Action(3, 2, 1), Action(2, 2, 3)]
    static = [
        tp(l, 1),  # autoregressive: one target pass on the root, no draft
        tp(l, 1),  # K ignored when L2 = 0
        tq(l, 1) + tq(l + 1, 1) + tq(l + 2, 1) + tp(l, 4),  # root, 2 fed trunk nodes (the 3rd is a leaf)
        tq(l, 1) + tq(l + 1, 2) + (tp(l, 4) * 3 + tp(l, 8)) / 4,  # root, one rollout level of 2 rows; n = 5
        tq(l, 1) + tq(l + 1, 1) + tq(l + 2, 1) + (tp(l, 4) + tp(l, 8)) / 2,  # L2 = 1: leaves only; n = 6
        tq(l, 1) + tq(l + 1, 1) + tq(l + 2, 1) + tq(l + 3, 2) + tq(l + 5, 2) + (tp(l, 8) * 7 + tp(l, 16)) / 8,
    ]
    np.testing.assert_allclose(m.step_seconds(l, actions), static, rtol=1e-12)
    f = m.feature_seconds
    np.testing.assert_allclose(m.step_seconds(l, actions, "target_only"), np.add(static, f), rtol=1e-12)
    paper = np.add(static, f)
    paper[:2] += tq(l, 1)  # no tree: the features still need the root's draft step
    np.testing.assert_allclose(m.step_seconds(l, actions, "paper"), paper, rtol=1e-12)
    with pytest.raises(ValueError, match="features"):
        m.step_seconds(l, actions, "all")


def test_step_seconds_takes_an_action_space_in_its_order():
    m = toy()
    space = ActionSpace(K=range(1, 4), L1=range(0, 3), L2=range(0, 3))
    np.testing.assert_array_equal(m.step_seconds(250, space, "paper"), m.step_seconds(250, list(space), "paper"))
    assert m.step_seconds(250, space).shape == (len(space),)


def test_step_seconds_matrix_is_step_seconds_per_root():
    m = toy()
    space = ActionSpace(K=range(1, 3), L1=range(0, 2), L2=range(0, 3))
    ctx = np.array([300, 40, 300, 1000])
    T = m.step_seconds_matrix(ctx, space, features="paper")
    assert T.shape == (4, len(space))
    for row, c in zip(T, ctx, strict=True):
        np.testing.assert_array_equal(row, m.step_seconds(int(c), space, features="paper"))
    assert m.step_seconds_matrix(np.zeros(0, dtype=int), space).shape == (0, len(space))


def test_draft_forwards_list_each_forward_with_its_cache_length():
    idx, ctx, rows = draft_forwards(10, [Action(3, 1, 3), Action(1, 0, 0)])
    assert idx.tolist() == [0, 0, 0, 0]
    assert list(zip(ctx.tolist(), rows.tolist(), strict=True)) == [(10, 1), (11, 1), (12, 3), (15, 3)]
    assert draft_forwards(10, [Action(1, 0, 0)], "paper")[1].tolist() == [10]


def test_step_overhead_is_charged_per_step_by_tree_size():
    actions = [Action(1, 0, 0), Action(1, 0, 1), Action(3, 0, 1), Action(2, 2, 3)]
    bare = toy().step_seconds(100, actions)
    m = toy(step_overhead={"plain": 1e-3, "speculative": 2e-3, "per_forward": -0.5e-3, "per_node": 0.25e-3})
    # draft forwards: 1,0,1 the root; 3,0,1 the root; 2,2,3 the root, 2 trunk nodes and 2 rollout levels
    want = [1e-3, 2e-3 - 0.5e-3 + 0.25e-3, 2e-3 - 0.5e-3 + 0.75e-3, 2e-3 - 5 * 0.5e-3 + 8 * 0.25e-3]
    np.testing.assert_allclose(m.step_seconds(100, actions) - bare, want, rtol=1e-12)
    np.testing.assert_allclose(m.step_seconds(100, actions, "target_only") - bare, np.add(want, m.feature_seconds),
                               rtol=1e-12)
    # an older profile (no step_overhead key) charges nothing; the key survives a round trip
    d = m.to_dict()
    assert LatencyModel.from_dict({k: v for k, v in d.items() if k != "step_overhead"}).step_overhead == {
        "plain": 0.0, "speculative": 0.0, "per_forward": 0.0, "per_node": 0.0}
    assert LatencyModel.from_dict(json.loads(json.dumps(d))).step_overhead == m.step_overhead


def test_measured_shapes_take_their_own_overhead():
    """``action_overhead`` replaces the fitted overhead for the shapes it names only, in every pricing path, and
    survives a round trip; an older profile without it prices as before."""
    actions = [Action(1, 0, 0), Action(1, 0, 1), Action(3, 0, 1), Action(2, 2, 3)]
    fit = {"plain": 1e-3, "speculative": 2e-3, "per_forward": 0.0, "per_node": 0.0}
    fitted = toy(step_overhead=fit)
    m = toy(step_overhead=fit, action_overhead={"1,0,1": -4e-3, "3, 0, 1": 5e-4})
    assert m.action_overhead == {"1,0,1": -4e-3, "3,0,1": 5e-4}  # keys normalized
    np.testing.assert_allclose(m.step_seconds(150, actions) - fitted.step_seconds(150, actions),
                               [0.0, -4e-3 - 2e-3, 5e-4 - 2e-3, 0.0], atol=1e-15)
    np.testing.assert_array_equal(m.step_seconds_matrix([150, 150, 300], actions)[0], m.step_seconds(150, actions))
    d = json.loads(json.dumps(m.to_dict()))
    assert LatencyModel.from_dict(d).action_overhead == m.action_overhead
    assert LatencyModel.from_dict({k: v for k, v in d.items() if k != "action_overhead"}).action_overhead == {}
    for bad, fragment in (({"1,0": 1e-3}, "not an action"), ({"1,0,1": float("inf")}, "finite"),
                          ([1], "must be a mapping")):
        with pytest.raises(LatencyProfileError, match=fragment):
            toy(action_overhead=bad)


def test_each_method_pays_its_own_verification_beyond_traversal():
    """``verify_seconds`` prices a method's outputs by its verify time minus Traversal's (the step overhead's method),
    for the shapes both measured; the empty tree, unmeasured shapes and methods pay nothing extra."""
    actions = [Action(1, 0, 0), Action(2, 0, 1), Action(1, 1, 0), Action(2, 2, 3)]
    verify = {"traversal": {"2,0,1": 3e-4, "1,1,0": 3e-4}, "gbv": {"2,0,1": 5.2e-3, "1,1,0": 6e-4},
              "naive": {"1,1,0": 2e-4}}
    m = toy(verify_seconds=verify)
    np.testing.assert_allclose(m.verify_offset("gbv", actions), [0.0, 4.9e-3, 3e-4, 0.0], atol=1e-15)
    np.testing.assert_allclose(m.verify_offset("naive", actions), [0.0, 0.0, -1e-4, 0.0], atol=1e-15)
    for none in ("traversal", "specinfer", None):
        np.testing.assert_array_equal(m.verify_offset(none, actions), np.zeros(4))
    methods = ["traversal", "gbv", "specinfer"]
    per = m.step_seconds_at([150, 300], actions, "target_only")
    got = m.output_seconds_at([150, 300], actions, methods, "target_only")  # [L, M * A], method-major
    assert got.shape == (2, 12)
    for i, method in enumerate(methods):
        np.testing.assert_allclose(got[:, 4 * i: 4 * i + 4], per + m.verify_offset(method, actions), atol=1e-15)
    np.testing.assert_array_equal(m.output_seconds_matrix([300, 150, 300], actions, methods)[[1, 0, 2]],
                                  m.output_seconds_at([150, 300, 300], actions, methods))
    assert toy().verify_offset("gbv", actions).tolist() == [0.0] * 4  # an older profile: as before
    d = json.loads(json.dumps(m.to_dict()))
    assert LatencyModel.from_dict(d).verify_seconds == m.verify_seconds == verify
    for bad, fragment in (({"gbv": {"2,0,1": -1e-3}}, "negative"), ({"gbv": {"2,0": 1e-3}}, r"verify_seconds\[gbv\] key"),
                          ({"gbv": 1.0}, "must map each method"), ({"gbv": {"2,0,1": float("nan")}}, "finite")):
        with pytest.raises(LatencyProfileError, match=fragment):
            toy(verify_seconds=bad)


@pytest.mark.parametrize("overhead, fragment", [
    ({"plain": 1e-3}, "step_overhead must have the keys"),
    ({"plain": 1e-3, "speculative": float("nan"), "per_forward": 0.0, "per_node": 0.0},
     "step_overhead.speculative must be a finite"),
    ([1e-3], "step_overhead must be a mapping"),
])
def test_malformed_step_overhead(overhead, fragment):
    with pytest.raises(LatencyProfileError, match=fragment):
        toy(step_overhead=overhead)


def test_save_load_round_trip(tmp_path):
    m = toy()
    path = m.save(tmp_path / "sub" / "latency.json")
    assert [p.name for p in path.parent.iterdir()] == ["latency.json"]  # no temp file left behind
    back = LatencyModel.load(path)
    for name in ("contexts", "draft_rows", "draft_seconds", "target_tokens", "target_seconds"):
        np.testing.assert_array_equal(getattr(back, name), getattr(m, name))
    assert back.feature_seconds == m.feature_seconds and back.meta == m.meta
    assert back.to_dict() == m.to_dict()


@pytest.mark.parametrize("change, fragment", [
    (lambda d: d.pop("target_seconds"), r"missing keys \['target_seconds'\]"),
    (lambda d: d.update(draft_seconds=[[1e-3, 2e-3]] * 3), r"draft_seconds must have shape \[3, 3\]"),
    (lambda d: d["target_seconds"][1].__setitem__(2, float("nan")), r"target_seconds\[1\]\[2\] = nan"),
    (lambda d: d["draft_seconds"][0].__setitem__(0, 0.0), r"draft_seconds\[0\]\[0\] = 0.0"),
    (lambda d: d.update(draft_rows=[2, 3, 4]), "draft_rows must start at 1"),
    (lambda d: d.update(contexts=[100, 400, 200]), "contexts must be strictly ascending"),
    (lambda d: d.update(feature_seconds=-1), "feature_seconds must be finite and > 0"),
    (lambda d: d.update(format_version=99), "re-run `branchpoint profile`"),
    (lambda d: d["draft_seconds"][2].pop(), "draft_seconds must be numbers in a regular"),
])
def test_malformed_profile_is_a_clear_error(tmp_path, change, fragment):
    d = json.loads(json.dumps(toy().to_dict()))
    change(d)
    path = tmp_path / "latency.json"
    path.write_text(json.dumps(d))
    with pytest.raises(LatencyProfileError, match=fragment) as info:
        LatencyModel.load(path)
    assert str(path) in str(info.value)


def test_missing_or_unreadable_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="branchpoint profile"):
        LatencyModel.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(LatencyProfileError, match="not valid JSON"):
        LatencyModel.load(tmp_path / "bad.json")


def test_imports_without_torch(tmp_path):
    """The ONNX runtime and the numpy stages import the latency model with torch unavailable."""
    toy().save(tmp_path / "latency.json")
    code = ("import sys; sys.modules['torch'] = None\n"
            "from decoding.latency import LatencyModel\n"
            "from decoding.actions import Action\n"
            f"m = LatencyModel.load({str(tmp_path / 'latency.json')!r})\n"
            "print(m.step_seconds(100, [Action(2, 2, 3)], 'paper')[0])\n"
            "assert 'torch' not in {k for k, v in sys.modules.items() if v is not None}\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout) > 0


def test_vectorized_pricing_is_bit_identical_to_one_length_at_a_time():
    m = toy(step_overhead={"plain": 1e-4, "speculative": -2e-3, "per_forward": 3e-4, "per_node": 1e-5})
    space = ActionSpace.from_config({"K": [1, 3], "L1": [0, 3], "L2": [0, 3]})
    lengths = [0, 7, 99, 100, 250, 401, 5000]
    for features in (None, "target_only", "paper"):
        block = m.step_seconds_at(lengths, space, features)
        for row, l in zip(block, lengths, strict=True):  # noqa: E741
            one = m.step_seconds(l, space, features)
            assert np.array_equal(row, one)
            # the scalar pricing sums the same forwards in the same order as before vectorizing: np.bincount
            k, l1, l2 = (np.array([getattr(a, f) for a in space]) for f in ("K", "L1", "L2"))
            idx, ctx, rows = draft_forwards(l, space, features)
            ref = np.zeros(len(space)) + np.bincount(idx, weights=m.t_q(ctx, rows), minlength=len(space))
            ref += m.t_p(np.full(len(space), float(l)), 1 + l1 + k * l2)
            assert np.all(np.abs(ref - one) < 5e-3)  # the rest is the overhead (and the feature cost)
    for l in (0, 63, 64, 300):  # noqa: E741
        assert m.root_step_seconds(l) == (m.t_q(float(l), 1), m.t_p(float(l), 1))


def test_block_memo_prices_a_block_per_miss_and_clears_past_its_cap():
    calls = []

    def price(lengths):
        calls.append(lengths.tolist())
        return [2 * c for c in lengths.tolist()]

    memo = BlockMemo(price, block=4, max_entries=8)
    assert memo.get(10) == 20 and memo.get(13) == 26 and calls == [[10, 11, 12, 13]]
    memo.get(14), memo.get(18)  # 12 lengths kept: more than the cap, so the next miss starts afresh
    assert memo.get(12) == 24 and len(calls) == 3
    memo.get(30)
    assert memo.get(10) == 20 and calls[-1] == [10, 11, 12, 13] and len(calls) == 5
