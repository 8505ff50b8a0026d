"""The collection core (data_collection/root_collector.py) and the dataset layer (data_collection/dataset.py)
on tiny random models: no train/serve skew, forest drafting = per-node full forwards, union-tree labels
= each action's own tree, resumable shards with checksums and config-hash refusal."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import torch
from engine_helpers import VOCAB, untied_pair

from data_collection.dataset import DatasetError, ShardWriter, load_collected, merge_manifests
from data_collection.root_collector import RootCollector, UnionTrees, forest_layout, root_positions, root_seed
from decoding.actions import Action, ActionSpace
from decoding.labels import expected_block_efficiency, union_labels
from decoding.policy import Policy
from decoding.sampling import Sampling
from decoding.tree import DraftTree
from decoding.union_tree import union_from_tokens, union_layout
from engine.decoder import SpeculativeDecoder
from engine.torch_sampling import prob_rows

SPACE = ActionSpace(range(1, 4), range(0, 3), range(0, 3))
METHODS = ["traversal", "specinfer", "spectr", "naive_tree"]


@pytest.fixture(scope="module")
def pair():
    return untied_pair(seed=3, noise=0.4)


class Recorder(Policy):
    """A selector that alternates speculation and plain steps and records the features it was handed."""

    needs_hidden_states = True

    def __init__(self):
        self.seen = []

    def select(self, features):
        self.seen.append(features)
        return [Action(2, 1, 2), Action(1, 0, 0), Action(1, 2, 0), Action(3, 0, 1)][len(self.seen) % 4]


def test_no_train_serve_skew(pair, one_thread):
    """The features the decoder hands a selector equal what collect computes along the emitted tokens."""
    target, draft = pair
    prompt = [5, 9, 33, 12, 40, 2]
    rec = Recorder()
    sampling = Sampling(1.0)
    res = SpeculativeDecoder(target, draft, VOCAB).generate(prompt, 40, "traversal", rec, sampling, seed=1)
    assert res.stats.steps == len(rec.seen) and any(n > 1 for n in res.stats.accepted_hist[1:])
    seq = prompt + res.tokens
    collector = RootCollector(target, draft, VOCAB, SPACE, METHODS, UnionTrees(1))
    positions = [f.context_length for f in rec.seen]
    feats = collector.features(seq, positions, sampling)
    for i, f in enumerate(rec.seen):
        assert seq[f.context_length] == (prompt + res.tokens)[f.context_length]
        for name in ("p_prev", "q_prev", "q_root"):
            np.testing.assert_allclose(getattr(f, name), feats[name][i], atol=1e-5, err_msg=f"{name} at step {i}")
        for name in ("h_p_prev", "h_q_prev", "h_q_root", "e_root"):
            got = getattr(f, name)
            assert got is not None, f"the decoder handed no {name} at step {i}"
            np.testing.assert_allclose(got, feats[name][i], atol=1e-4, err_msg=f"{name} at step {i}")
        root_row = target.get_input_embeddings().weight[seq[f.context_length]].detach().numpy()
        np.testing.assert_array_equal(f.e_root, root_row)  # the root token's row of the target's input table


def test_prefill_equals_token_by_token(pair, one_thread):
    """One prefill of the trajectory gives the hidden states of feeding it token by token."""
    target, draft = pair
    seq = list(np.random.default_rng(1).integers(0, VOCAB, 30))
    collector = RootCollector(target, draft, VOCAB, SPACE, METHODS)
    _, logits, hidden = collector.prefill(target, seq)
    from engine.cache import KVState
    from engine.tree_pass import forward_nodes

    kv = KVState(target)
    for i, tok in enumerate(seq):
        with torch.inference_mode():
            lg, h = forward_nodes(kv, [tok], [i], np.ones((1, i + 1), dtype=bool), True)
        np.testing.assert_allclose(h[0].numpy(), hidden[i].numpy(), atol=1e-5)
        np.testing.assert_allclose(lg[0].numpy(), logits[i].numpy(), atol=1e-4)


def _full_row(model, tokens, sampling):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits[0, -1]
    return prob_rows(logits, sampling, VOCAB)


def test_forest_rows_equal_full_forwards(pair, one_thread):
    """The KV-cached forest drafting and the target's forest pass give the rows of plain full forwards."""
    target, draft = pair
    sampling = Sampling(0.8, 0.95)
    seq = list(np.random.default_rng(2).integers(0, VOCAB, 25))
    r = 20
    collector = RootCollector(target, draft, VOCAB, SPACE, METHODS, UnionTrees(2))
    pre = collector._prefill(seq, [r], sampling)
    from engine.drafting import DraftRoot, DraftRule, draft_layout
    from engine.tree_pass import target_tree_pass

    drafted = draft_layout(DraftRoot(pre["kv_d"].fork(r + 1), pre["q_root"][0]), collector.parents, collector.depths,
                           DraftRule(sampling, VOCAB), np.random.default_rng(0))
    forest = DraftTree(SPACE.max_action, drafted.tokens, collector.parents, collector.depths, collector.children,
                       drafted.q_rows)
    logits, _ = target_tree_pass(pre["kv_t"].fork(r), seq[r], forest)
    p_rows = prob_rows(logits, sampling, VOCAB)
    for node in range(0, forest.num_nodes, 7):
        context = seq[: r + 1] + list(forest.path_tokens(node))
        np.testing.assert_allclose(p_rows[node], _full_row(target, context, sampling), atol=1e-5)
        if node in drafted.node_slots:
            np.testing.assert_allclose(drafted.q_rows[node], _full_row(draft, context, sampling), atol=1e-5)
    # each copy is a well-formed union tree whose sub-trees match the action layouts
    m = collector.union_nodes
    assert forest.num_nodes == 1 + 2 * (m - 1)
    parents, _, _ = union_layout(SPACE)
    idx = np.concatenate([[0], np.arange(m, 2 * m - 1)])
    np.testing.assert_array_equal(np.where(collector.parents[idx[1:]] == 0, 0, collector.parents[idx[1:]] - (m - 1)),
                                  parents[1:])


def test_union_labels_equal_each_actions_own_tree(pair, one_thread):
    """Given the same drafted tokens, the union tree's label of every action equals the exact block
    efficiency computed on that action's own tree."""
    target, draft = pair
    sampling = Sampling(1.0)
    seq = list(np.random.default_rng(3).integers(0, VOCAB, 30))
    collector = RootCollector(target, draft, VOCAB, SPACE, METHODS, UnionTrees(1))
    pre = collector._prefill(seq, [25], sampling)
    from engine.drafting import DraftRoot, DraftRule, draft_layout
    from engine.tree_pass import target_tree_pass

    parents, depths, _ = union_layout(SPACE)
    drafted = draft_layout(DraftRoot(pre["kv_d"].fork(26), pre["q_root"][0]), parents, depths,
                           DraftRule(sampling, VOCAB), np.random.default_rng(5))
    union = union_from_tokens(SPACE, drafted.tokens, drafted.q_rows)
    logits, _ = target_tree_pass(pre["kv_t"].fork(25), seq[25], union.tree)
    p_rows = prob_rows(logits, sampling, VOCAB)
    values, _ = union_labels(union, p_rows, METHODS)
    for i, a in enumerate(SPACE):
        sub = union.subtree(a)
        for m in METHODS:
            if a.tree_size == 0:
                assert values[m][i] == pytest.approx(1.0)
                continue
            own = expected_block_efficiency(sub, p_rows[union.subtree_nodes(a)], m)
            assert values[m][i] == pytest.approx(own, abs=1e-9), (m, a)


def test_collect_rows_are_deterministic_per_root(pair, one_thread):
    """A root's row depends only on (seed, key, position): collecting a subset gives the same rows."""
    target, draft = pair
    seq = list(np.random.default_rng(4).integers(0, VOCAB, 50))
    collector = RootCollector(target, draft, VOCAB, SPACE, METHODS, UnionTrees(2, 7))
    both = collector.collect(seq, [20, 36], Sampling(1.0), "k")
    one = collector.collect(seq, [36], Sampling(1.0), "k")
    for m in METHODS:
        np.testing.assert_allclose(both.labels[m][1], one.labels[m][0], atol=1e-6)
        assert np.all(both.labels[m][0] >= 1.0 - 1e-9)
    other = collector.collect(seq, [36], Sampling(1.0), "other-key")
    assert not np.allclose(other.labels["specinfer"][0], one.labels["specinfer"][0])


def test_root_positions_and_seeds():
    seq = list(range(40))
    assert root_positions(10, seq, 16, eos=set()) == [10, 26]
    assert root_positions(10, seq, 16, eos={26}) == [10]
    with pytest.raises(ValueError, match="root_stride"):
        root_positions(10, seq, 0, set())
    assert root_seed(0, "a", 3).random() == root_seed(0, "a", 3).random() != root_seed(0, "a", 4).random()
    parents, depths, m = forest_layout(SPACE, 3)
    assert parents.shape == (1 + 3 * (m - 1),) and np.all(parents[1:] < np.arange(1, parents.shape[0]))


def _header(h="abc", num_trees=4):
    return {"config_hash": h, "config": {"collect": {"num_trees": num_trees}}, "format_version": 1,
            "shard": {"index": 0, "count": 1}}


def _tiny_table(n, split="train"):
    return pa.table({"split": [split] * n, "x": list(range(n))})


def test_shards_resume_detect_corruption_and_refuse_other_configs(tmp_path, capsys):
    out = tmp_path / "collect"
    w = ShardWriter(out, 0, 1, _header())
    w.write(0, _tiny_table(3))
    w.write(1, _tiny_table(2, "test"))
    # a new writer (a restarted process) sees both shards as done
    w2 = ShardWriter(out, 0, 1, _header())
    assert w2.done(0) and w2.done(1) and not w2.done(2)
    # corrupt one shard: it is no longer done
    shard = out / w2.manifest["shards"]["1"]["file"]
    shard.write_bytes(shard.read_bytes()[:-20])
    assert not w2.done(1)
    assert "corrupt" in capsys.readouterr().out
    w2.write(1, _tiny_table(2, "test"))
    w2.manifest["complete"] = True
    (out / "manifest-0of1.json").write_text(json.dumps(w2.manifest))
    merged = merge_manifests(out)
    assert merged["rows"] == 5
    ds = load_collected(out)
    assert len(ds) == 5 and len(load_collected(out, splits=["test"])) == 2
    # another configuration: one clear line naming the differing key
    with pytest.raises(DatasetError, match=r"collect\.num_trees: 4 -> 2"):
        ShardWriter(out, 0, 1, _header("other", num_trees=2))
    # --restart wipes it
    w3 = ShardWriter(out, 0, 1, _header("other", num_trees=2), restart=True)
    assert not w3.done(0) and not (out / "manifest.json").exists()


def test_merge_refuses_unfinished_or_mismatched_parts(tmp_path):
    out = tmp_path / "c"
    for i in range(2):
        h = {**_header(), "shard": {"index": i, "count": 2}}
        w = ShardWriter(out, i, 2, h)
        w.write(0, _tiny_table(1))
    with pytest.raises(DatasetError, match="not finished"):
        merge_manifests(out)
    with pytest.raises(DatasetError, match="no process manifests"):
        merge_manifests(tmp_path / "empty")
