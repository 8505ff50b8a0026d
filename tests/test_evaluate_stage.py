"""``branchpoint evaluate`` end to end on a tiny saved pair: tiny trajectories, a tiny collected dataset (the
collection core and the shard writer of `branchpoint collect`), a toy latency profile and an exported random
selector; checks every output (metrics, plot data, report and figures, MLflow run)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from selector_helpers import SPACE, random_inputs, random_selector, toy_latency

from decoding.actions import parse_action
from decoding.errors import UserInputError

METHODS = ["traversal", "specinfer", "gbv"]
SETTINGS = [(1.0, 1.0), (0.6, 0.95)]
SPLITS = ["train", "train", "train", "train", "test", "test", "test"]


def _trajectories(rng):
    from data_collection.trajectory_store import Trajectory

    out = []
    for i, split in enumerate(SPLITS):
        temp, top_p = SETTINGS[i % 2]
        out.append(Trajectory(f"p{i}", f"src{i % 2}", split, temp, top_p, 0,
                              [1, *map(int, rng.integers(3, 64, 6))], [int(x) for x in rng.integers(3, 64, 30)]))
    return out


def _collect(pair, trajs, out):
    from data_collection.dataset import FORMAT_VERSION, ShardWriter, merge_manifests
    from data_collection.dataset_schema import rows_table, trajectory_key
    from data_collection.root_collector import RootCollector, UnionTrees
    from decoding.features import FeatureSchema
    from decoding.files import write_json_atomic
    from decoding.sampling import Sampling

    collector = RootCollector(pair.target, pair.draft, pair.vocab_size, SPACE, METHODS, UnionTrees(2, 0))
    hidden = {"target": int(pair.target.config.hidden_size), "draft": int(pair.draft.config.hidden_size)}
    header = {"format_version": FORMAT_VERSION, "config_hash": "tiny-eval", "config": {"tiny": True},
              "pair": {"target": "tiny", "draft": "tiny", "hidden_sizes": hidden, "vocab_size": pair.vocab_size},
              "actions": [str(a) for a in SPACE], "methods": METHODS, "num_trees": 2, "root_stride": 5,
              "grid": {"K": [1, 2], "L1": [0, 2], "L2": [0, 2]},
              "schema": FeatureSchema.for_pair("paper", hidden["target"], hidden["draft"]).to_dict(),
              "shard": {"index": 0, "count": 1}}
    writer = ShardWriter(out, 0, 1, header)
    rows = []
    for t in trajs:
        seq = list(t.prompt_ids) + list(t.continuation_ids)
        positions = list(range(len(t.prompt_ids), len(seq), 5))
        rows.append(collector.collect(seq, positions, Sampling(t.temperature, t.top_p), trajectory_key(t)))
    writer.write(0, rows_table(trajs, rows, METHODS, len(SPACE)))
    writer.manifest["complete"] = True
    write_json_atomic(writer.path, writer.manifest)
    merge_manifests(out)


@pytest.fixture(scope="module")
def params(tmp_path_factory):
    import torch
    from tiny_models import save_tiny_model

    from data_collection.trajectory_store import save_trajectories
    from export.onnx_export import export_selector
    from models.loading import load_pair

    root = tmp_path_factory.mktemp("eval")
    t = save_tiny_model(root / "target", 2, seed=0)
    d = save_tiny_model(root / "draft", 1, seed=1)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pair = load_pair(f"hf:{t}", f"hf:{d}", "cpu", "float32")
        trajs = _trajectories(np.random.default_rng(0))
        save_trajectories(root / "traj", trajs, {"target": f"hf:{t}"})
        _collect(pair, [x for x in trajs if x.split != "draft"], root / "collect")
    finally:
        torch.set_num_threads(before)
    toy_latency().save(root / "latency.json")
    from decoding import pricing

    net, meta, schema = random_selector("paper", methods=tuple(METHODS), hidden=(32, 32), seed=2)
    inputs = random_inputs(schema, 16, seed=1)
    ctx = inputs["scalars"][:, schema.scalars.index("context_length")].astype(int)
    seconds = pricing.step_seconds(toy_latency(), ctx, list(SPACE), METHODS, "paper")
    export_selector(net, meta, root / "selector", inputs, seconds.astype(np.float32))
    path = root / "params.yaml"
    path.write_text(
        f"model:\n  target: hf:{t}\n  draft: hf:{d}\n  device: cpu\n  threads: 1\n"
        "actions:\n  K: [1, 2]\n  L1: [0, 2]\n  L2: [0, 2]\n"
        f"trajectories:\n  out: {root / 'traj'}\n"
        f"collect:\n  out: {root / 'collect'}\n  methods: [{', '.join(METHODS)}]\n"
        f"profile:\n  out: {root / 'latency.json'}\n"
        f"export:\n  out: {root / 'selector'}\n"
        f"tracking:\n  uri: sqlite:///{root / 'mlflow.db'}\n  experiment: eval-test\n"
        "evaluate:\n  prompts: 2\n  seeds: [0, 1]\n  max_new_tokens: 8\n  methods: [specinfer, gbv]\n"
        "  selector_methods: [traversal, gbv]\n  bootstrap: 200\n  chain: true\n  threshold_chain: true\n"
        "  tune_prompts: 3\n  tune_max_new_tokens: 6\n  tune_lengths: [1, 3]\n  tune_thresholds: [0.0, 1.0]\n"
        "  lookup_lengths: [1, 2]\n  lookup_min_ngrams: [1]\n  lookup_tune_max_new_tokens: 6\n"
        f"  train_metrics: {root / 'train.json'}\n  metrics: {root / 'out/evaluate.json'}\n"
        f"  plots: {root / 'out/plots'}\n  report: {root / 'out/reports/report.md'}\n")
    return root, path


def test_evaluate_stage_writes_every_output(params, capsys):
    from pipeline.cli import main

    root, path = params
    assert main(["evaluate", "--params", str(path)]) == 0
    printed = capsys.readouterr().out
    m = json.loads((root / "out/evaluate.json").read_text())
    names = ["autoregressive", "chain", "static:traversal", "static:specinfer", "static:gbv", "adaptive_chain",
             "threshold_chain", "prompt_lookup", "selector:auto", "selector:traversal", "selector:gbv",
             "selector:auto:lookup"]
    assert list(m["policies"]) == names and m["units"] == {"prompts": 2, "available_test_prompts": 3,
                                                           "seeds": [0, 1], "max_new_tokens": 8, "runs": 48}
    _check_pricing_audit(m)
    for name, e in m["policies"].items():
        assert e["units"] == 4 and e["prompts"] == 2
        r = e["tokens_per_second"]
        assert r["value"] > 0 and r["low"] <= r["value"] <= r["high"], name
        assert e["block_efficiency"]["value"] >= 1.0
    ar = m["policies"]["autoregressive"]
    assert ar["block_efficiency"]["value"] == 1.0 and ar["tps_vs_autoregressive"]["value"] == pytest.approx(1.0)
    assert m["policies"]["static:traversal"]["tps_vs_traversal_best_static"]["value"] == pytest.approx(1.0)
    chain = parse_action(m["policies"]["chain"]["action"])
    assert chain.is_chain and chain.tree_size > 0 and m["policies"]["chain"]["method"] == "naive"
    for name in ("static:traversal", "static:specinfer", "static:gbv"):
        assert parse_action(m["policies"][name]["action"]).tree_size > 0
        assert m["policies"][name]["offline"]["tps"] > 0
    # the restricted selectors never chose another method's output
    for method in ("traversal", "gbv"):
        used = {k.split(":")[0] for k in m["chosen"][f"selector:{method}"]}
        assert used <= {method, "plain"}, used
    assert sum(m["chosen"]["selector:auto"].values()) == pytest.approx(1.0)
    # the headline policy is the selector alone; lookup then selector is reported beside it under its own name
    assert m["selector"]["policy"] == "selector:auto" and m["selector"]["policy_lookup_then"] == "selector:auto:lookup"
    sel = m["policies"]["selector:auto"]
    assert m["selector_tps_vs_autoregressive"] == sel["tps_vs_autoregressive"]["value"]
    then = m["policies"]["selector:auto:lookup"]
    assert m["lookup_then_selector_vs_ar"] == then["tps_vs_autoregressive"]["value"]
    assert m["lookup_then_selector_vs_prompt_lookup"] == then["tps_vs_prompt_lookup"]["value"]
    assert m["prompt_lookup_vs_ar"] == m["policies"]["prompt_lookup"]["tps_vs_autoregressive"]["value"]
    # each labelled policy's offline path estimate next to its online ratio (issue #43); chains and lookup have none
    ovo = m["offline_vs_online"]
    assert {"autoregressive", "static:traversal"} <= set(ovo) and "prompt_lookup" not in ovo, set(ovo)
    for name, r in ovo.items():
        assert r["offline"] == m["policies"][name]["offline"]["vs_autoregressive"]
        assert r["inside"] == (r["low"] <= r["offline"] <= r["high"])
    # the peers: flat paired ratios of the selector to each, with their interval (None where a peer did not run)
    assert m["best_static"] in ("static:traversal", "static:specinfer", "static:gbv")
    assert m["policies"][m["best_static"]]["best_static"] and not m["policies"]["chain"]["best_static"]
    for key, ref in (("ar", "autoregressive"), ("best_static", "best_static"), ("adaptive_chain", "adaptive_chain"),
                     ("threshold_chain", "threshold_chain"), ("prompt_lookup", "prompt_lookup")):
        r = sel[f"tps_vs_{ref}"]
        assert (m[f"selector_vs_{key}"], m[f"selector_vs_{key}_lo"], m[f"selector_vs_{key}_hi"]) == (
            r["value"], r["low"], r["high"]) and r["low"] <= r["value"] <= r["high"]
    tuning = m["threshold_chain_tuning"]  # the grid, decoded on TRAIN prompts, and its fastest point
    assert tuning["prompts"] == 3 and [(g["max_length"], g["threshold"]) for g in tuning["grid"]] == [
        (1, 0.0), (1, 1.0), (3, 0.0), (3, 1.0)]
    fastest = max(tuning["grid"], key=lambda g: g["tokens_per_second"])
    assert (tuning["max_length"], tuning["threshold"]) == (fastest["max_length"], fastest["threshold"])
    assert all(g["tokens"] > 0 and g["seconds"] > 0 for g in tuning["grid"])
    # threshold 1 stops every chain after one token, threshold 0 never stops before N: steps differ
    by_point = {(g["max_length"], g["threshold"]): g for g in tuning["grid"]}
    assert by_point[(3, 1.0)]["steps"] == by_point[(1, 0.0)]["steps"] == by_point[(1, 1.0)]["steps"]
    used = {k.split(":")[1] for k in m["chosen"]["threshold_chain"]}
    assert all(parse_action(a).is_chain and parse_action(a).L1 <= tuning["max_length"] for a in used)
    lookup = m["prompt_lookup_tuning"]  # length x shortest suffix, decoded on TRAIN prompts, and its fastest point
    assert [(g["length"], g["min_ngram"]) for g in lookup["grid"]] == [(1, 1), (2, 1)] and lookup["prompts"] == 3
    fastest = max(lookup["grid"], key=lambda g: g["tokens_per_second"])
    assert (lookup["length"], lookup["min_ngram"]) == (fastest["length"], fastest["min_ngram"])
    # prompt lookup takes plain steps and lookup chains (no draft model); the selector with lookup also drafts (a
    # one-token suffix of these random tokens matches often, not always)
    plain = m["chosen"]["prompt_lookup"]
    assert set(plain) <= {"plain", "lookup:1", "lookup:2"}, plain
    with_lookup = m["chosen"]["selector:auto:lookup"]
    assert any(k.startswith("lookup:") for k in with_lookup) and any(k.startswith("traversal:") or
                                                                     k.startswith("specinfer:") for k in with_lookup)
    adaptive = m["chosen"]["adaptive_chain"]  # naive chains only (the grid's K = 1, L2 = 0 actions)
    assert adaptive and all(k.split(":")[0] == "naive" and parse_action(k.split(":")[1]).is_chain for k in adaptive)
    depth = (root / "out/plots/acceptance_by_depth.csv").read_text().splitlines()
    assert depth[0].split(",") == ["depth", "chain", "static_traversal", "selector", "chain_from_labels"]
    assert depth[1].split(",")[3] != ""  # the selector's depth-1 acceptance
    assert set(m["gain_by_temperature"]["autoregressive"]) == {"0.6", "1.0"}
    by_t = m["selector_by"]["temperature"]  # where it speculates / what it chooses, per sampling setting
    by_s = m["selector_by"]["source"]
    assert set(by_t) == {"0.6", "1.0"} and sum(e["steps"] for e in by_t.values()) == sum(e["steps"] for e in by_s.values())
    for e in [*by_t.values(), *m["selector_by"]["source"].values()]:
        assert 0 <= e["speculate_fraction"] <= 1 and 0 < sum(e["top"].values()) <= 1 + 1e-9
    assert m["findings"]["gbv"]["testable"] and m["findings"]["claim1_traversal_beats_ot_at_root_branching"]["testable"]
    assert m["offline"]["selector"] is None and m["offline"]["test_roots"] > 0
    for f in ("tps_by_policy", "gain_by_temperature", "gain_by_source", "acceptance_by_depth", "chosen_actions"):
        assert (root / f"out/plots/{f}.csv").stat().st_size > 20
    report = (root / "out/reports/report.md").read_text()
    figures = [line.split("](")[1].rstrip(")") for line in report.splitlines() if line.startswith("![")]
    assert len(figures) >= 4 and all((root / "out/reports" / f).is_file() for f in figures)
    assert "| T = 0.6 |" in report and "## Where the selector speculates" in report and "## Pricing audit" in report
    assert "| selector:auto |" in report and "GBV vs Traversal" in report and "static:traversal" in printed
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    everything = mlflow.search_runs(experiment_names=["eval-test"])
    runs = everything[everything["tags.stage"] == "evaluate"].reset_index(drop=True)
    parent = everything[everything["tags.stage"] == "pipeline"]
    assert len(runs) == 1 and len(parent) == 1  # the evaluate run, nested under the pipeline run
    assert runs["tags.mlflow.parentRunId"][0] == parent["run_id"].iloc[0]
    assert runs["metrics.selector_auto/tokens_per_second"][0] > 0


def test_best_static_is_chosen_over_every_labelled_method_but_only_it_is_decoded(params):
    """With ``evaluate.methods: [traversal]`` every collected method's best static is priced offline (TRAIN picks
    ``best_static``), and the statics decoded online are the chain, Traversal's and the best one only."""
    from evaluation import online as oe
    from pipeline.config import load_config
    from pipeline.evaluate import offline_part

    root, path = params
    cfg = load_config(path, ["evaluate.methods=[traversal]"])
    off = offline_part(cfg)
    assert set(off["offline"]) == {oe.AUTOREGRESSIVE, oe.CHAIN_STATIC, *(f"static:{m}" for m in METHODS)}
    assert set(off["statics"]) == {oe.CHAIN_STATIC, "static:traversal", off["best_static"]}
    # the best static is the highest TRAIN TPS of all three methods, recomputed here from the labels
    from data_collection.offline_table import load_offline_table
    from decoding.latency import LatencyModel

    tab = load_offline_table(cfg.collect.out, cfg.actions.space(), LatencyModel.load(cfg.profile.out),
                             priced=[*METHODS, oe.CHAIN_METHOD])
    on_fit = tab.rows(tab.columns["split"] == "train")
    statics = oe.best_statics(on_fit, METHODS, True)
    train_tps = oe.offline_tps(on_fit, statics)
    assert off["best_static"] == max((f"static:{m}" for m in METHODS), key=lambda n: train_tps[n]["tps"])


def test_the_headline_is_the_selector_alone_and_lookup_then_selector_has_its_own_name():
    from types import SimpleNamespace

    from pipeline.evaluate import selector_policies

    def policies(*names):
        return [SimpleNamespace(name=n, kind="selector") for n in names]

    both = selector_policies(policies("selector:auto", "selector:auto:lookup"))
    assert (both["selector"], both["lookup_then_selector"]) == ("selector:auto", "selector:auto:lookup")
    alone = selector_policies(policies("selector:auto"))
    assert alone["selector"] == "selector:auto" and alone["lookup_then_selector"] is None


def _check_pricing_audit(m):
    """Every policy's steps are priced by class next to their measured seconds; autoregressive is the reference."""
    audit = m["pricing_audit"]
    assert set(audit) == set(m["policies"])
    assert audit["autoregressive"]["relative_to_autoregressive"] == pytest.approx(1.0)
    assert set(audit["autoregressive"]["by_class"]) == {"plain"}
    for name, e in audit.items():
        assert e["steps"] == sum(c["steps"] for c in e["by_class"].values()) > 0, name
        assert e["modelled_seconds"] > 0 and e["measured_seconds"] > 0 and e["prefill_seconds"] > 0, name
        assert e["measured_seconds"] == pytest.approx(sum(c["measured_seconds"] for c in e["by_class"].values()))
        assert e["relative_to_autoregressive"] > 0 and isinstance(e["holds"], bool)
    assert all(k.startswith("lookup:") or k == "plain" for k in audit["prompt_lookup"]["by_class"])
    # deciding, measured in the decoder beside its price: for the policies that decide with features only
    for name, e in audit.items():
        d = e.get("deciding")
        if m["policies"][name]["kind"] == "selector":
            assert 0 < d["steps"] <= e["steps"] and d["measured_seconds"] > 0 and d["modelled_seconds"] > 0, name
            assert d["measured_ms_per_step"] == pytest.approx(1000 * d["measured_seconds"] / d["steps"])
        else:
            assert d is None, name
    assert any(k.startswith("gbv:") for k in audit["static:gbv"]["by_class"])


def test_mlflow_names_the_lookup_first_policy_for_what_decodes_first():
    from pipeline.evaluate import mlflow_name

    assert mlflow_name("selector:auto") == "selector_auto"
    assert mlflow_name("selector:auto:lookup") == "lookup_then_selector_auto"
    assert mlflow_name("static:traversal") == "static_traversal"


def test_selector_methods_must_have_an_effect():
    """issue #47: a setting with no effect is an error naming it, not a silent skip."""
    from types import SimpleNamespace

    from decoding.errors import UserInputError
    from pipeline.evaluate import check_selector_methods

    auto = SimpleNamespace(auto=True, methods=["traversal", "specinfer"])
    single = SimpleNamespace(auto=False, methods=["specinfer"])
    check_selector_methods([], single, "sel")  # the default: nothing asked
    check_selector_methods(["traversal"], auto, "sel")
    with pytest.raises(UserInputError, match=r"evaluate.selector_methods \['traversal'\] has no effect.*specinfer"):
        check_selector_methods(["traversal"], single, "sel")
    with pytest.raises(UserInputError, match=r"names \['gbv'\], which the selector in sel does not predict"):
        check_selector_methods(["traversal", "gbv"], auto, "sel")


def test_the_offline_table_is_the_dataset_with_its_prices_and_names_a_wrong_grid(params):
    """data_collection/offline_table.py: one table of labels, step prices and root columns (collect's summary and
    evaluate's offline table read it); a grid or a method the dataset was not collected with is a clear error."""
    from data_collection.dataset import label_matrix, load_collected
    from data_collection.offline_table import load_offline_table
    from decoding import pricing
    from decoding.actions import ActionSpace
    from decoding.latency import LatencyModel
    from pipeline.config import load_config

    _, path = params
    cfg = load_config(path)
    latency, space = LatencyModel.load(cfg.profile.out), cfg.actions.space()
    tab = load_offline_table(cfg.collect.out, space, latency)
    ds = load_collected(cfg.collect.out)
    assert len(tab) == len(ds) and set(tab.labels) == set(METHODS)
    np.testing.assert_array_equal(tab.labels["specinfer"], label_matrix(ds, "specinfer"))
    np.testing.assert_array_equal(tab.seconds[pricing.VERIFY_REFERENCE],
                                  pricing.step_seconds(latency, np.asarray(ds["context_length"]), space))
    test = tab.split_rows("test")
    assert test.sum() == (np.asarray(ds["split"]) == "test").sum() > 0
    assert tab.rows(test).labels["traversal"].shape == (test.sum(), len(space))
    assert tab.split_rows("nosuch").all() and not tab.split_rows("nosuch", all_when_missing=False).any()
    # extra columns, a root column among them (it was read twice, and pyarrow refused the duplicate field)
    more = load_offline_table(cfg.collect.out, space, latency, columns=["l1_p_q_prev", "entropy_p_prev"])
    np.testing.assert_array_equal(more.columns["entropy_p_prev"], np.asarray(ds["entropy_p_prev"]))
    np.testing.assert_array_equal(more.columns["l1_p_q_prev"], tab.columns["l1_p_q_prev"])
    with pytest.raises(UserInputError, match="another action grid"):
        load_offline_table(cfg.collect.out, ActionSpace(range(1, 2), range(0, 2), range(0, 1)), latency)
    with pytest.raises(UserInputError, match="no labels for"):
        load_offline_table(cfg.collect.out, space, latency, methods=["nss"])
