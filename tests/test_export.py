"""ONNX export (export/onnx_export.py) and the torch-free runtime (export/runtime.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from selector_helpers import SPACE, random_inputs, random_selector, toy_latency

from decoding import pricing
from decoding.features import FeatureError
from decoding.policy import Choice, RootFeatures
from decoding.sampling import Sampling
from export.onnx_export import ExportParityError, export_selector
from export.runtime import ONNX_FILE, SIDECAR_FILE, SelectorArtifactError, SelectorRuntime


def _seconds(schema, inputs, methods):
    lat = toy_latency()
    ctx = inputs["scalars"][:, schema.scalars.index("context_length")]
    return pricing.step_seconds(lat, ctx.astype(int), list(SPACE), methods, schema.feature_set).astype(np.float32)


def _torch_decisions(net, meta, inputs, seconds):
    from export.onnx_export import DecisionGraph

    graph = DecisionGraph(net, meta["outputs"]["valid"]).eval()
    names = [i["name"] for i in meta["schema"]["inputs"]]
    with torch.no_grad():
        e, c = graph(*(torch.from_numpy(inputs[n]) for n in names), torch.from_numpy(seconds))
    return e.numpy(), c.numpy()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    net, meta, schema = random_selector("paper", methods=("traversal", "bv"))
    inputs = random_inputs(schema, 64, seed=1)
    seconds = _seconds(schema, inputs, meta["outputs"]["methods"])
    folder = tmp_path_factory.mktemp("sel") / "selector"
    sidecar = export_selector(net, meta, folder, inputs, seconds)
    return folder, net, meta, schema, sidecar


def test_sidecar_is_generated_and_checked(exported):
    folder, net, meta, schema, sidecar = exported
    assert sidecar["parity"]["identical_choices"] and sidecar["parity"]["max_abs_diff"] <= 1e-4
    assert sidecar["features"] == schema.to_dict()
    assert sidecar["outputs"]["table"][len(SPACE)] == ["bv", str(SPACE[0])]
    assert sidecar["inputs"] == ["h_p_prev", "h_q_prev", "h_q_root", "scalars", "step_seconds"]
    import onnx

    props = {p.key: p.value for p in onnx.load(str(folder / ONNX_FILE)).metadata_props}
    assert props["branchpoint.feature_set"] == "paper" and props["branchpoint.methods"] == "traversal,bv"


def test_runtime_in_a_torch_free_process_decides_like_torch(exported, tmp_path):
    """Round trip: export, load with SelectorRuntime where importing torch fails, same decisions."""
    folder, net, meta, schema, _ = exported
    inputs = random_inputs(schema, 40, seed=7)
    seconds = _seconds(schema, inputs, meta["outputs"]["methods"])
    _, want = _torch_decisions(net, meta, inputs, seconds)
    valid = np.asarray(meta["outputs"]["valid"])
    assert valid[want].all()  # invalid outputs (bv on branching trees) are never chosen
    np.savez(tmp_path / "x.npz", seconds=seconds, **inputs)
    code = textwrap.dedent(f"""
        import sys
        for name in ("torch", "transformers", "models", "numba", "scipy"):
            sys.modules[name] = None
        import numpy as np
        from export.runtime import SelectorRuntime
        rt = SelectorRuntime({str(folder)!r})
        d = dict(np.load({str(tmp_path / 'x.npz')!r}))
        seconds = d.pop("seconds")
        _, choice = rt.run_graph(d, seconds)
        print(" ".join(map(str, choice.tolist())))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert [int(x) for x in out.stdout.split()] == want.tolist()


def test_select_implements_the_protocol(exported):
    folder, net, meta, schema, _ = exported
    rt = SelectorRuntime(folder, latency=toy_latency())
    assert rt.needs_hidden_states and rt.needs_draft
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(8))
    root = RootFeatures(300, Sampling(0.7), p, rng.dirichlet(np.ones(8)), p, rng.normal(size=12),
                        rng.normal(size=8), rng.normal(size=8))
    choice = rt.select(root)
    assert isinstance(choice, Choice) and choice.method in ("traversal", "bv") and choice.action in SPACE
    x = schema.vectorize(root, toy_latency())
    _, want = _torch_decisions(net, meta, {k: v[None] for k, v in x.items()}, rt.step_seconds(300)[None])
    assert rt.table[int(want[0])] == (choice.method, choice.action)
    # step_seconds is priced for a block of context lengths and kept: each equals pricing that length alone,
    # and a caller's edit of a returned array does not reach the kept one
    lat, extra = toy_latency(), float(rt.sidecar.get("inference_seconds") or 0.0)
    for c in (300, 301, 363, 364, 2):
        alone = pricing.step_seconds(lat, [c], rt.actions, rt.methods, schema.feature_set, extra)[0]
        assert np.array_equal(rt.step_seconds(c), alone.astype(np.float32))
    rt.step_seconds(301)[:] = -1
    assert (rt.step_seconds(301) > 0).all()
    with pytest.raises(FeatureError, match="NaN"):
        rt.select(RootFeatures(300, Sampling(0.7), p * np.nan, p, p, root.h_p_prev, root.h_q_prev, root.h_q_root))
    with pytest.raises(FeatureError, match="h_q_root"):
        rt.run_graph({k: v for k, v in random_inputs(schema, 2).items() if k != "h_q_root"}, np.ones((2, 18)))
    with pytest.raises(FeatureError, match="expected shape"):
        rt.run_graph(random_inputs(schema, 2) | {"h_p_prev": np.zeros((2, 5), np.float32)}, np.ones((2, 18)))


def test_tampered_onnx_and_mismatched_sidecar_fail_clearly(exported, tmp_path):
    import shutil

    folder = exported[0]
    bad = tmp_path / "tampered"
    shutil.copytree(folder, bad)
    data = bytearray((bad / ONNX_FILE).read_bytes())
    data[-5] ^= 0xFF
    (bad / ONNX_FILE).write_bytes(bytes(data))
    with pytest.raises(SelectorArtifactError, match="sha256"):
        SelectorRuntime(bad)
    other = tmp_path / "mismatch"
    shutil.copytree(folder, other)
    side = json.loads((other / SIDECAR_FILE).read_text())
    side["features"]["hidden"][0]["size"] = 13  # the sidecar now describes another feature width
    (other / SIDECAR_FILE).write_text(json.dumps(side))
    with pytest.raises(SelectorArtifactError, match="do not match the sidecar"):
        SelectorRuntime(other)


def test_failed_parity_leaves_nothing_behind(tmp_path):
    net, meta, schema = random_selector("target_only")
    inputs = random_inputs(schema, 8)
    seconds = _seconds(schema, inputs, ["traversal"])
    out = tmp_path / "selector"
    with pytest.raises(ExportParityError, match="parity"):
        export_selector(net, meta, out, inputs, seconds, atol=-1.0)  # no graph can pass a negative tolerance
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_sidecar_feature_list_is_checked_against_the_code_schema(exported, tmp_path):
    """An extra scalar, or two scalars swapped, in the sidecar's feature list is refused, naming the difference."""
    import shutil

    folder, _, _, schema, _ = exported
    extra = tmp_path / "extra"
    shutil.copytree(folder, extra)
    side = json.loads((extra / SIDECAR_FILE).read_text())
    side["features"]["scalars"].append({"name": "made_up_scalar", "side": "target", "source": "", "doc": ""})
    (extra / SIDECAR_FILE).write_text(json.dumps(side))
    with pytest.raises(SelectorArtifactError, match=r"feature scalars .*extra \['made_up_scalar'\]"):
        SelectorRuntime(extra)
    swapped = tmp_path / "swapped"
    shutil.copytree(folder, swapped)
    side = json.loads((swapped / SIDECAR_FILE).read_text())
    s = side["features"]["scalars"]
    s[0], s[1] = s[1], s[0]
    (swapped / SIDECAR_FILE).write_text(json.dumps(side))
    with pytest.raises(SelectorArtifactError, match="other order"):
        SelectorRuntime(swapped)
    assert SelectorRuntime(folder).schema.scalars == schema.scalars  # the untouched export still loads


def test_known_outputs_stay_fixed_in_the_export_and_scores_are_named_so(exported, tmp_path):
    folder, net, meta, schema, sidecar = exported
    rt = SelectorRuntime(folder)
    inputs = random_inputs(schema, 16, seed=5)
    e, _ = rt.run_graph(inputs, _seconds(schema, inputs, meta["outputs"]["methods"]))
    empty = [o for o, (_, a) in enumerate(rt.table) if a.tree_size == 0]
    assert empty and np.array_equal(e[:, empty], np.ones((16, len(empty)), dtype=np.float32))
    tied = sidecar["outputs"]["tied"]
    assert any(t != o for o, t in enumerate(tied)) and np.array_equal(e, e[:, tied])
    assert sidecar["outputs"]["names"] == ["expected_block_efficiency", "choice"]
    # the throughput objective's outputs are decision scores: named so in the graph, the sidecar and the runtime
    net_t, meta_t, schema_t = random_selector("paper", methods=("traversal",), objective="throughput")
    x = random_inputs(schema_t, 8, seed=2)
    side_t = export_selector(net_t, meta_t, tmp_path / "thr", x, _seconds(schema_t, x, ["traversal"]))
    assert side_t["outputs"]["names"] == ["score", "choice"] and "argmax over valid outputs of score" in side_t["decision"]
    rt_t = SelectorRuntime(tmp_path / "thr")
    assert rt_t.output_names == ("score", "choice")
    assert [o.name for o in rt_t.session.get_outputs()] == ["score", "choice"]
    assert isinstance(rt_t.select(RootFeatures(40, Sampling(), np.full(8, 1 / 8), np.full(8, 1 / 8),
                                               np.full(8, 1 / 8), np.zeros(12, np.float32),
                                               np.zeros(8, np.float32), np.zeros(8, np.float32))), Choice)
