"""The latency model T(c, a) (decoding/latency.py): interpolation, pricing of a step, persistence, errors."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from decoding.actions import Action
from decoding.latency import BlockMemo, LatencyModel, LatencyProfileError, StepRatios

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
         "feature_seconds": {"target_only": 0.5e-3, "paper": 0.6e-3}, "meta": {"machine": "test"}}
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


def test_step_ratios_round_trip_and_malformed_ones_are_clear_errors():
    ratios = StepRatios(1.2, 200.0, {"tables": 0.9, "step": 0.2, "forward": 0.05, "node": 0.01},
                        {"tables": 1.0, "step": 0.1, "node": 0.0})
    m = toy(step_ratios=ratios)
    back = LatencyModel.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back.step_ratios == ratios
    assert toy().step_ratios == StepRatios()  # none measured: the tables alone
    assert StepRatios().tree_vector().tolist() == [1, 0, 0, 0] and StepRatios().chain_vector().tolist() == [1, 0, 0]
    base = {"plain_scale": 1.0, "context": 100}
    for bad, fragment in (({"plain_scale": 1.0}, "needs plain_scale and context"),
                          ({**base, "plain_scale": 0.0}, "positive"),
                          ({**base, "tree": {"tables": 1.0, "step": 0.1}}, "must map"),
                          ({**base, "chain": {"tables": 1.0, "step": -0.1, "node": 0.0}}, ">= 0"),
                          ({**base, "tree": {"tables": "x", "step": 0, "forward": 0, "node": 0}}, "numbers"),
                          ([1.0], "must be a mapping")):
        with pytest.raises(LatencyProfileError, match=fragment):
            toy(step_ratios=bad)
    old = {**m.to_dict(), "format_version": 3}  # a profile of the previous format: re-run profile
    with pytest.raises(LatencyProfileError, match="re-run `branchpoint profile`"):
        LatencyModel.from_dict(old)


def test_verify_seconds_are_checked_and_kept():
    verify = {"traversal": {"2,0,1": 3e-4, "1,1,0": 3e-4}, "gbv": {"2,0,1": 5.2e-3}}
    m = toy(verify_seconds=verify)
    assert LatencyModel.from_dict(json.loads(json.dumps(m.to_dict()))).verify_seconds == m.verify_seconds == verify
    assert m.verify_of["gbv"] == {Action(2, 0, 1): 5.2e-3}
    for bad, fragment in (({"gbv": {"2,0,1": -1e-3}}, "negative"), ({"gbv": {"2,0": 1e-3}}, r"verify_seconds\[gbv\] key"),
                          ({"gbv": 1.0}, "must map each method"), ({"gbv": {"2,0,1": float("nan")}}, "finite")):
        with pytest.raises(LatencyProfileError, match=fragment):
            toy(verify_seconds=bad)


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
    (lambda d: d.update(feature_seconds={"paper": -1}), r"feature_seconds\['paper'\] must be finite and > 0"),
    (lambda d: d.update(feature_seconds=0.5e-3), "feature_seconds must map feature sets to seconds"),
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
            "from decoding.pricing import step_seconds\n"
            "print(step_seconds(m, [100], [Action(2, 2, 3)], None, 'paper')[0, 0])\n"
            "assert 'torch' not in {k for k, v in sys.modules.items() if v is not None}\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout) > 0


def test_root_step_seconds_are_the_one_row_and_one_token_tables():
    m = toy()
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
