"""Selector training (models/selector_*.py, pipeline/train.py) on a tiny REAL collected dataset and on
synthetic data with a learnable signal: splits by prompt, train-only standardization, both objectives
learn, the decision rule, realized-TPS metrics by hand, save/load, the auto layout, the CLI stage."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from selector_helpers import METHODS, SPACE, build_collected, toy_latency

from decoding.actions import Action, ActionSpace
from decoding.features import FeatureSchema
from decoding.pricing import decide
from selector.data import Labels, SelectorData, SelectorDataModule, build_selector_data
from selector.network import NetShape, OutputLayout, SelectorNet, load_selector, save_selector
from selector.report import selector_report
from selector.training import SelectorModule, fit_selector, predict


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    torch.set_num_threads(1)
    return build_collected(tmp_path_factory.mktemp("collect") / "data")


def _hp(**changes):
    """The config's optimisation knobs (`pipeline.sections.TrainConfig`, their one home) with ``changes``."""
    import dataclasses

    from pipeline.sections import TrainConfig
    from pipeline.training_data import hparams

    return hparams(dataclasses.replace(TrainConfig(), **changes))


def _real_data(collected, feature_set="paper", methods=("traversal", "specinfer"), auto=True) -> SelectorData:
    from data_collection.dataset import label_matrix, load_collected, read_dataset_manifest

    ds = load_collected(collected)
    hidden = read_dataset_manifest(collected)["pair"]["hidden_sizes"]
    schema = FeatureSchema.for_pair(feature_set, hidden["target"], hidden["draft"])
    layout = OutputLayout(tuple(methods), tuple(SPACE), auto)
    labels = {m: label_matrix(ds, m) for m in METHODS}
    return build_selector_data(ds.with_format("numpy")[:], Labels(labels), schema, layout, toy_latency())


def test_datamodule_splits_never_mix_prompts(collected):
    data = _real_data(collected)
    dm = SelectorDataModule(data, batch_size=16)
    prompts = {s: set(data.prompt_id[data.rows(s)]) for s in ("train", "val", "test")}
    assert all(prompts.values())
    assert not (prompts["train"] & prompts["val"]) and not (prompts["train"] & prompts["test"])
    assert not (prompts["val"] & prompts["test"])
    assert set(data.prompt_id[dm.train_idx]) == prompts["train"] and set(data.prompt_id[dm.val_idx]) == prompts["val"]
    n_train = sum(b[-1].shape[0] for b in dm.train_dataloader())
    n_val = sum(b[-1].shape[0] for b in dm.val_dataloader())
    assert (n_train, n_val) == (dm.train_idx.size, dm.val_idx.size)


def test_standardization_uses_train_only(collected):
    data = _real_data(collected, "target_only", methods=("specinfer",), auto=False)
    stats = SelectorDataModule(data).standardization()
    train = data.rows("train")
    np.testing.assert_allclose(stats["scalars"][0], data.inputs["scalars"][train].mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats["h_p_prev"][1], data.inputs["h_p_prev"][train].std(0), rtol=1e-5)
    held_out = data.split != "train"
    for x in data.inputs.values():
        x[held_out] = x[held_out] * 1000.0 + 7.0  # held-out rows must not move the statistics
    after = SelectorDataModule(data).standardization()
    for k in stats:
        np.testing.assert_allclose(after[k][0], stats[k][0], rtol=1e-6)
    net = SelectorNet(data.schema.hidden_sizes, len(data.schema.scalars), data.layout.size)
    fit_selector(net, SelectorDataModule(data, 32), _hp(epochs=1))
    np.testing.assert_allclose(net.scalars_mean.numpy(), stats["scalars"][0].astype(np.float32), rtol=1e-5)


def synthetic(n: int = 600, seed: int = 0) -> SelectorData:
    """4 actions whose Ê depends on scalar 0 (x): small trees win for x < 0, large ones for x > 0."""
    rng = np.random.default_rng(seed)
    actions = (Action(1, 0, 0), Action(1, 1, 0), Action(1, 2, 0), Action(1, 3, 0))
    layout = OutputLayout(("specinfer",), actions)
    schema = FeatureSchema.for_pair("target_only", 8, 8)
    x = rng.normal(size=n)
    scalars = rng.normal(size=(n, len(schema.scalars))).astype(np.float32)
    scalars[:, 0] = x
    accept = 1 / (1 + np.exp(-3 * x))  # [n] acceptance of each drafted token
    E = np.stack([1 + sum((accept ** j for j in range(1, L + 1)), np.zeros(n)) for L in range(4)], axis=1)  # [n, 4]
    E = E + 0.05 * rng.normal(size=E.shape)
    cost = np.tile([1.0, 1.3, 1.6, 1.9], (n, 1))
    split = np.array(["train"] * (n // 2) + ["val"] * (n // 4) + ["test"] * (n - n // 2 - n // 4))
    return SelectorData(schema=schema, layout=layout,
                        inputs={"h_p_prev": rng.normal(size=(n, 8)).astype(np.float32),
                                "e_root": np.zeros((n, 8), np.float32), "scalars": scalars},  # no signal
                        labels=E.astype(np.float32), label_se=np.full(E.shape, 0.05, np.float32), cost=cost,
                        cost_static=cost.copy(), cost_ar=np.ones(n), split=split,
                        prompt_id=np.array([f"p{i}" for i in range(n)]), source=np.array(["s"] * n),
                        temperature=np.ones(n), top_p=np.ones(n), context_length=np.full(n, 100))


@pytest.mark.parametrize("objective", ["regression", "throughput"])
def test_objectives_reduce_their_loss_on_a_learnable_signal(objective, one_thread):
    data = synthetic()
    dm = SelectorDataModule(data, batch_size=64)
    net = SelectorNet(data.schema.hidden_sizes, len(data.schema.scalars), 4, NetShape(16, (32, 16), 0.0))
    hp = _hp(objective=objective, epochs=40, lr=3e-3)
    fit = data.subset(dm.train_idx)
    batch = dm.full_batch("train")

    def loss_now():
        module = SelectorModule(net, hp, fit, fit, fit.valid_outputs())
        module.eval()
        with torch.no_grad():
            return float(module.loss(batch))

    torch.manual_seed(0)
    net.set_standardization({k: (torch.as_tensor(m), torch.as_tensor(s)) for k, (m, s) in dm.standardization().items()})
    from selector.training import init_output_bias

    init_output_bias(net, fit.labels, fit.valid_outputs())
    before = loss_now()
    module, _ = fit_selector(net, dm, hp)
    after = loss_now()
    report = module.last_report
    if objective == "regression":
        assert after < 0.3 * before, (before, after)
        assert report["spearman"] > 0.6  # mean of 4 outputs; AR (Ê = 1 + noise) has no signal, rho ~ 0
    else:
        assert after < before - 0.02, (before, after)
    # the signal is learnable: the selector beats the best static action on held-out roots
    assert report["selector_vs_best_static"] > 1.03
    assert report["selector_vs_oracle"] > 0.95


def test_decision_rule_picks_argmax_of_E_over_T():
    E = np.array([[2.0, 3.0, 1.0], [2.0, 3.0, np.nan]])
    T = np.array([[1.0, 2.0, 0.4], [1.0, 1.0, 0.1]])
    # rates: root 0: 2, 1.5, 2.5 -> 2; root 1: 2, 3, NaN (never chosen) -> 1
    assert decide(E, T).tolist() == [2, 1]
    assert decide(E, T, valid=np.array([True, True, False])).tolist() == [0, 1]
    assert decide(np.array([2.0, 2.0]), np.array([1.0, 1.0])) == 0  # ties go to the first output


def _hand_data() -> SelectorData:
    """2 roots x 3 actions (AR, (1,1,0), (1,2,0)); costs in seconds."""
    actions = (Action(1, 0, 0), Action(1, 1, 0), Action(1, 2, 0))
    schema = FeatureSchema.for_pair("target_only", 2, 2)
    E = np.array([[1.0, 1.8, 2.1], [1.0, 1.2, 1.3]])
    cost_static = np.array([[1.0, 1.5, 2.0], [1.0, 1.5, 2.0]])
    n = 2
    return SelectorData(schema=schema, layout=OutputLayout(("specinfer",), actions),
                        inputs={"h_p_prev": np.zeros((n, 2), np.float32), "e_root": np.zeros((n, 2), np.float32),
                                "scalars": np.zeros((n, len(schema.scalars)), np.float32)},
                        labels=E.astype(np.float32), label_se=np.zeros_like(E, np.float32), cost=cost_static + 0.1,
                        cost_static=cost_static, cost_ar=np.ones(n), split=np.array(["test", "test"]),
                        prompt_id=np.array(["a", "b"]), source=np.array(["x", "y"]), temperature=np.ones(n),
                        top_p=np.ones(n), context_length=np.array([10, 20]))


def test_path_tps_metrics_against_hand_values():
    data = _hand_data()
    # fit set, path TPS n / sum(T / E): 2/(1+1) = 1, 2/(1.5/1.8 + 1.5/1.2) = 0.96, 2/(2/2.1 + 2/1.3) = 0.80 -> output 0
    pred = np.array([[1.0, 2.0, 0.0], [1.0, 0.0, 0.0]])  # picks (1,1,0) at root 0 (2/1.6 > 1/1.1), AR at root 1
    r = selector_report(pred, data, data)
    assert r["_choice"].tolist() == [1, 0]
    sel = 2 / (1.6 / 1.8 + 1.1 / 1.0)
    assert r["tps"]["selector"] == pytest.approx(sel)
    assert r["tps"]["best_static"] == pytest.approx(1.0)
    # oracle per root (static costs): root 0 rates 1, 1.2, 1.05 -> (1,1,0); root 1 rates 1, 0.8, 0.65 -> AR
    orc = 2 / (1.5 / 1.8 + 1.0)
    assert r["tps"]["oracle"] == pytest.approx(orc)
    assert r["tps"]["autoregressive"] == pytest.approx(1.0)
    assert r["regret"] == pytest.approx(1 - sel / orc)
    assert r["per_root_regret"] == pytest.approx(np.mean([1 - (1.8 / 1.6) / 1.2, 1 - (1 / 1.1) / 1.0]))
    assert r["mae"] == pytest.approx(np.mean([np.mean([0, 0.2, 2.1]), np.mean([0, 1.2, 1.3])]))
    assert r["chosen"] == {"1,1,0": 0.5, "1,0,0": 0.5}
    assert r["by_source"]["x"]["tps"]["selector"] == pytest.approx(1.8 / 1.6)


def test_round_trip_keeps_the_schema_input_order(tmp_path):
    """The default schema's hidden inputs are not in alphabetical order (h_p_prev, e_root); the JSON writer sorts
    keys, and a reload that took that order fed each input to the other's projection (issue #43)."""
    schema = FeatureSchema.for_pair("target_only", 6, 5)
    hidden = dict(schema.hidden_sizes)
    assert list(hidden) != sorted(hidden), "the test needs a schema whose hidden inputs are not sorted"
    torch.manual_seed(0)
    net = SelectorNet(hidden, len(schema.scalars), 4, NetShape(8, (16,)))
    net.set_standardization({n: (torch.randn(s), torch.rand(s) + 0.5)
                             for n, s in {**hidden, "scalars": len(schema.scalars)}.items()})
    net.eval()
    layout = OutputLayout(("specinfer",), tuple(ActionSpace(range(1, 2), range(0, 4), range(0, 1))), False)
    meta = {"feature_set": "target_only", "schema": schema.to_dict(), "objective": "regression",
            "outputs": {**layout.to_dict(), "valid": [True] * 4}}
    save_selector(tmp_path / "sel", net, meta)
    loaded, _ = load_selector(tmp_path / "sel")
    assert loaded.input_names == net.input_names == tuple(schema.input_shapes())
    xs = [torch.randn(3, s) for s in (*hidden.values(), len(schema.scalars))]
    assert torch.equal(net(*xs), loaded(*xs))


def test_save_load_round_trip_gives_identical_outputs(tmp_path):
    torch.manual_seed(0)
    net = SelectorNet({"h_p_prev": 6, "h_q_prev": 5, "h_q_root": 5}, 4, 10, NetShape(8, (16, 8)))
    net.set_standardization({"h_p_prev": (torch.randn(6), torch.rand(6) + 0.5), "h_q_prev": (torch.randn(5), torch.rand(5)),
                             "h_q_root": (torch.zeros(5), torch.ones(5)), "scalars": (torch.randn(4), torch.rand(4) + 1)})
    net.eval()
    layout = OutputLayout(("traversal", "specinfer"), tuple(ActionSpace(range(1, 2), range(0, 5), range(0, 1))), True)
    schema = FeatureSchema.for_pair("paper", 6, 5)
    meta = {"feature_set": "paper", "schema": schema.to_dict(), "outputs": {**layout.to_dict(), "valid": [True] * 10},
            "objective": "regression", "dataset": {"config_hash": "abc"}}
    save_selector(tmp_path / "sel", net, meta)
    loaded, got = load_selector(tmp_path / "sel")
    xs = [torch.randn(3, 6), torch.randn(3, 5), torch.randn(3, 5), torch.randn(3, 4)]
    assert torch.equal(net(*xs), loaded(*xs))
    assert got["dataset"] == {"config_hash": "abc"} and got["architecture"]["widths"] == [16, 8]
    assert OutputLayout.from_dict(got["outputs"]) == layout
    assert FeatureSchema.from_dict(got["schema"]) == schema
    from selector.network import SelectorLoadError

    with pytest.raises(SelectorLoadError, match="not found"):
        load_selector(tmp_path / "missing")


def test_auto_layout_is_method_major(collected):
    from data_collection.dataset import label_matrix, load_collected

    data = _real_data(collected, "paper", METHODS, auto=True)
    lay = data.layout
    A = len(SPACE)
    assert lay.size == 2 * A and lay.output(A + 3) == ("specinfer", SPACE[3])
    assert lay.index("specinfer", SPACE[3]) == A + 3 and lay.method_outputs("traversal") == slice(0, A)
    ds = load_collected(collected)
    np.testing.assert_allclose(data.labels[:, lay.method_outputs("specinfer")], label_matrix(ds, "specinfer"))
    np.testing.assert_allclose(data.cost[:, :A], data.cost[:, A:])  # the same action costs the same
    # the selector's cost includes deciding (its features' seconds from the profile, and its inference; paper
    # features: the root's draft step for AR); static costs do not
    ar = SPACE.index(Action(1, 0, 0))
    lat = toy_latency()
    l0 = int(data.context_length[0])
    assert data.cost[0, ar] == pytest.approx(data.cost_static[0, ar] + lat.feature_seconds["paper"]
                                             + data.meta["inference_seconds"] + float(lat.t_q(l0, 1)))
    assert OutputLayout.from_dict(lay.to_dict()) == lay
    with pytest.raises(ValueError, match="exactly one method"):
        OutputLayout(("a", "b"), tuple(SPACE), auto=False)
    # predictions per (method, action); `auto` reports per method
    net = SelectorNet(data.schema.hidden_sizes, len(data.schema.scalars), lay.size)
    r = selector_report(predict(net, data), data, data.subset(data.rows("train")))
    assert set(r["by_method"]) == set(METHODS)


def test_branchpoint_train_smoke(collected, tmp_path, monkeypatch):
    from decoding.latency import LatencyModel
    from pipeline.cli import main

    profile = toy_latency().save(tmp_path / "latency.json")
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    rc = main(["train", "--set", f"collect.out={collected}", "--set", f"profile.out={profile}", "--set", "train.epochs=2", "--set", "train.method=auto",
               "--set", "train.feature_set=target_only",
               "--set", "train.baselines=[best_static,ridge]", "--set", "train.out=sel", "--set", "train.metrics=metrics/train.json"])
    assert rc == 0
    metrics = json.loads((tmp_path / "metrics/train.json").read_text())
    assert metrics["test"]["tps"]["selector"] > 0 and set(metrics["baselines"]) == {"best_static", "ridge"}
    assert metrics["baselines"]["best_static"]["test"]["selector_vs_best_static"] == pytest.approx(1.0)
    assert (tmp_path / "sel/checkpoints/best.ckpt").is_file()
    net, meta = load_selector(tmp_path / "sel")
    assert meta["dataset"]["config_hash"] == "tiny0123" and meta["outputs"]["auto"] is True
    assert LatencyModel.from_dict(meta["latency"]).feature_seconds == toy_latency().feature_seconds
    assert len(meta["outputs"]["valid"]) == net.num_outputs == 2 * len(SPACE)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("branchpoint")
    runs = client.search_runs([exp.experiment_id])
    parent = [r.info.run_id for r in runs if r.data.tags.get("stage") == "pipeline"]
    runs = [r for r in runs if r.data.tags.get("stage") != "pipeline"]
    assert len(runs) == 3 and len(parent) == 1  # selector + 2 baselines, nested under the pipeline run
    assert all(r.data.tags["mlflow.parentRunId"] == parent[0] for r in runs)
    sel = next(r for r in runs if r.data.tags.get("model") == "selector")
    assert sel.data.tags["dataset_config_hash"] == "tiny0123" and sel.data.tags["stage"] == "train"
    assert "git_revision" in sel.data.tags
    assert "val/tps/selector" in sel.data.metrics and "test/selector_vs_oracle" in sel.data.metrics
    assert len(client.get_metric_history(sel.info.run_id, "val/tps/selector")) == 2  # per epoch
    arts = {a.path for a in client.list_artifacts(sel.info.run_id, "plots")}
    assert "plots/test_chosen_actions.png" in arts and "plots/test_pred_vs_measured.png" in arts


def test_losses_against_hand_values():
    from selector.training import policy_tps, regression_loss, throughput_loss

    pred = torch.tensor([[1.0, 2.0, 3.0]])
    E = torch.tensor([[1.5, 2.0, float("nan")]])
    valid = torch.tensor([True, True, True])
    assert float(regression_loss(pred, E, None, valid)) == pytest.approx(0.25 / 2)  # NaN label skipped
    se = torch.tensor([[0.0, 1.0, 0.0]])
    w0, w1 = 1 / 0.05 ** 2, 1 / (1 + 0.05 ** 2)
    assert float(regression_loss(pred, E, se, valid, "inverse_se")) == pytest.approx(w0 * 0.25 / (w0 + w1))
    # policy: beta -> large picks argmax Ê/T; TPS_pi = Ê/T of that output
    E2, cost = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1.0, 1.5, 3.0]])
    assert float(policy_tps(E2, E2, cost, valid, torch.tensor(200.0))) == pytest.approx(2 / 1.5, rel=1e-4)
    # beta = 0: uniform policy, TPS = mean Ê / mean T
    assert float(policy_tps(E2, E2, cost, valid, torch.tensor(0.0))) == pytest.approx(6 / 5.5)
    base = torch.tensor([1.0])
    ratio = 6 / 5.5
    expected = -np.log(ratio) + 0.0  # ratio > 1: no hinge
    tps = policy_tps(E2, E2, cost, valid, torch.tensor(0.0))
    assert float(throughput_loss(tps / base, 1.0, 0.5)) == pytest.approx(expected)
    base = torch.tensor([2.0])  # ratio < 1: hinge (1 - ratio)^2 on the worst fraction (the one root)
    r = ratio / 2
    assert float(throughput_loss(tps / base, 3.0, 0.5)) == pytest.approx(
        -np.log(r) + 3.0 * (1 - r) ** 2)


def test_duplicate_steps_are_never_chosen():
    space = ActionSpace(range(1, 3), range(0, 2), range(0, 2))  # (K, L1, L2), K in 1..2
    lay = OutputLayout(("traversal", "specinfer"), tuple(space), auto=True)
    d = dict(zip([f"{m}:{a}" for m in lay.methods for a in lay.actions], lay.distinct(), strict=True))
    assert d["traversal:1,0,0"] and not d["traversal:2,0,0"] and not d["specinfer:1,0,0"]  # one plain step
    assert d["traversal:1,1,0"] and not d["traversal:2,1,0"] and d["specinfer:1,1,0"]  # chains: K irrelevant
    assert d["traversal:2,0,1"] and d["specinfer:2,1,1"]


def test_known_outputs_are_fixed_and_tied_not_learned(tmp_path):
    """The empty tree's output is exactly 1 at every root (whatever the weights, and with no gradient);
    an L2 = 0 chain equals its smallest-K twin; both survive save / load."""
    layout = OutputLayout(("traversal", "specinfer"), tuple(SPACE), True)
    tied, fixed = layout.constraints()
    empty = [o for o in range(layout.size) if layout.output(o)[1].tree_size == 0]
    assert sorted(fixed) == empty and set(fixed.values()) == {1.0} and len(empty) == 2 * 2  # K = 1, 2
    m, a = layout.output(tied[layout.index("specinfer", Action(2, 2, 0))])
    assert (m, a) == ("specinfer", Action(1, 2, 0))
    assert tied[layout.index("traversal", Action(2, 1, 2))] == layout.index("traversal", Action(2, 1, 2))
    torch.manual_seed(0)
    net = SelectorNet({"h_p_prev": 6}, 3, layout.size, NetShape(8, (16,), 0.0), tied=tied, fixed=fixed)
    with torch.no_grad():
        net.mlp[-1].bias.add_(5.0)  # a fitted output would move with its bias
    x = [torch.randn(7, 6), torch.randn(7, 3)]
    out = net(*x)
    assert torch.equal(out[:, empty], torch.ones(7, len(empty)))
    k2 = layout.index("traversal", Action(2, 2, 0))
    assert torch.equal(out[:, k2], out[:, layout.index("traversal", Action(1, 2, 0))])
    out[:, empty].sum().backward()
    assert all(p.grad is None or torch.count_nonzero(p.grad) == 0 for p in net.parameters())
    meta = {"feature_set": "paper", "schema": {}, "outputs": {**layout.to_dict(), "valid": layout.distinct()}}
    save_selector(tmp_path / "sel", net.eval(), meta)
    loaded, _ = load_selector(tmp_path / "sel")
    assert torch.equal(loaded(*x), net(*x))
    with pytest.raises(ValueError, match="free output"):
        SelectorNet({"h_p_prev": 6}, 3, 3, tied=[1, 2, 2])


def test_learning_curve_study_trains_on_growing_prompt_subsets(collected, tmp_path, monkeypatch):
    from pipeline.study import main, train_subset

    data = _real_data(collected)
    train_prompts = sorted(set(data.prompt_id[data.rows("train")].tolist()))
    sub = train_subset(data, set(train_prompts[:1]))
    assert set(sub.prompt_id[sub.rows("train")].tolist()) == {train_prompts[0]}
    assert len(sub.rows("val")) == len(data.rows("val")) and len(sub.rows("test")) == len(data.rows("test"))
    profile = toy_latency().save(tmp_path / "latency.json")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "study/lc.json"
    assert main(["learning-curve", "--fractions", "0.5", "1", "--out", str(out), "--set", f"collect.out={collected}",
                 "--set", f"profile.out={profile}", "--set", "train.epochs=2",
                 "--set", "train.feature_set=target_only"]) == 0
    result = json.loads(out.read_text())
    pts = result["points"]
    assert [p["fraction"] for p in pts] == [0.5, 1.0] and pts[0]["train_prompts"] == 2 and pts[1]["train_prompts"] == 4
    assert pts[0]["train_roots"] < pts[1]["train_roots"] and pts[0]["test_roots"] == pts[1]["test_roots"] > 0
    assert all(0 < p["selector_vs_oracle"] <= 1 + 1e-9 and p["mae"] >= 0 for p in pts)
    assert (tmp_path / "study/lc.png").stat().st_size > 1000
    with pytest.raises(SystemExit):
        main(["learning-curve", "--fractions", "0"])


def test_baseline_predictions_take_the_known_values():
    from selector.baselines import with_known_values

    layout = OutputLayout(("traversal",), tuple(SPACE))
    pred = np.random.default_rng(0).normal(size=(5, layout.size))
    got = with_known_values(pred, layout)
    empty = [o for o in range(layout.size) if layout.output(o)[1].tree_size == 0]
    assert np.all(got[:, empty] == 1.0)
    k2, k1 = layout.index("traversal", Action(2, 1, 0)), layout.index("traversal", Action(1, 1, 0))
    assert np.array_equal(got[:, k2], pred[:, k1]) and np.array_equal(got[:, k1], pred[:, k1])
    free = layout.index("traversal", Action(2, 1, 2))
    assert np.array_equal(got[:, free], pred[:, free])


def test_feature_ablation_zeroes_one_input_per_variant(collected, tmp_path, monkeypatch):
    from pipeline.config import load_config
    from pipeline.feature_ablation import main, without
    from pipeline.training_data import training_data

    profile = toy_latency().save(tmp_path / "latency.json")
    cfg = load_config(None, [f"collect.out={collected}", f"profile.out={profile}", "train.feature_set=target_only"])
    data = training_data(cfg).data
    gone = without(data, "e_root")
    assert not gone.inputs["e_root"].any() and data.inputs["e_root"].any()  # the original is untouched
    assert gone.inputs["h_p_prev"] is data.inputs["h_p_prev"]
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "ablation.json"
    assert main(["--seeds", "0", "--out", str(out), "--set", f"collect.out={collected}",
                 "--set", f"profile.out={profile}", "--set", "train.epochs=2"]) == 0
    res = json.loads(out.read_text())
    assert set(res["mean"]) == {"all inputs", "without h_p_prev", "without e_root"}
    assert all(0 < m["test"]["selector_vs_oracle"] <= 1 + 1e-9 for m in res["mean"].values())


def test_objectives_study_scores_each_objective(collected, tmp_path, monkeypatch):
    from pipeline.study import main

    profile = toy_latency().save(tmp_path / "latency.json")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "study/ob.json"
    assert main(["objectives", "--objectives", "regression", "throughput", "--seeds", "0", "1",
                 "--out", str(out), "--set", f"collect.out={collected}", "--set", f"profile.out={profile}",
                 "--set", "train.epochs=2", "--set", "train.feature_set=target_only"]) == 0
    result = json.loads(out.read_text())
    assert [(r["variant"], r["seed"]) for r in result["rows"]] == [
        ("regression", 0), ("regression", 1), ("throughput", 0), ("throughput", 1)]
    assert all(0 < r["selector_vs_oracle"] <= 1 + 1e-9 for r in result["rows"])
    summary = result["summary"]["regression"]
    values = [r["selector_vs_best_static"] for r in result["rows"][:2]]
    assert summary["min"] == min(values) and summary["max"] == max(values)
    assert summary["selector_vs_best_static_mean"] == pytest.approx(sum(values) / 2)


def test_the_selector_starts_from_the_same_weights_under_one_seed(collected, tmp_path):
    """Stage train is reproducible: its network's initial weights come from train.seed, not from whatever the
    global RNG held (two runs on the same data ended with different selectors before)."""
    import dataclasses

    from pipeline.config import load_config
    from pipeline.training_data import training_data

    profile = toy_latency().save(tmp_path / "latency.json")
    cfg = load_config(None, [f"collect.out={collected}", f"profile.out={profile}", "train.feature_set=target_only"])
    td = training_data(cfg)
    first = td.new_net(cfg.train).state_dict()
    torch.rand(7)  # move the global RNG
    again = td.new_net(cfg.train).state_dict()
    other = td.new_net(dataclasses.replace(cfg.train, seed=cfg.train.seed + 1)).state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)
