"""Tree pass and KV-cache pruning of the engine, exact against plain forward passes.

- Every node's logits from ONE tree pass equal a separate (cache-free) forward of context + root +
  path(node), for Llama, Qwen2 (with sliding layers) and Gemma3 (sliding + full layers), under sdpa and
  eager attention.
- After pruning both caches to an accepted path, the next logits equal a fresh forward of the whole
  accepted sequence (no re-computation of the context).
"""

import copy

import numpy as np
import pytest
import torch
from tiny_models import tiny_config
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from decoding.actions import Action
from decoding.sampling import Sampling
from decoding.tree import build_tree, tree_layout
from engine.cache import KVState
from engine.drafting import DraftRoot, DraftRule, draft_tree
from engine.torch_sampling import to_numpy_rows, transform_logits
from engine.tree_pass import forward_nodes, prefill, target_tree_pass

ATOL = 1e-5
V = 64


def _small(kind: str, attn: str, seed: int = 0):
    torch.manual_seed(seed)
    common = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if kind == "llama":
        model = LlamaForCausalLM(tiny_config(3, hidden=32))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=True, sliding_window=6,
                                             max_window_layers=1))
    else:
        model = Gemma3ForCausalLM(Gemma3TextConfig(**common, head_dim=8, sliding_window=6,
                                                   layer_types=["sliding_attention", "full_attention",
                                                                "sliding_attention"]))
    model.set_attn_implementation(attn)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model.eval()


def _full_logits(model, ids: list[int]) -> torch.Tensor:
    """Last-position logits of a plain forward over ``ids`` (no cache, model's own masks)."""
    return model(input_ids=torch.tensor([ids])).logits[0, -1]


def _random_tree(action: Action, rng: np.random.Generator):
    parents, _ = tree_layout(action)
    tokens = rng.integers(3, V, size=parents.shape[0])
    tokens[0] = -1
    return build_tree(action, tokens, np.full((parents.shape[0], V), 1.0 / V))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@torch.inference_mode()
def test_tree_pass_matches_separate_forwards(kind, attn):
    model = _small(kind, attn)
    rng = np.random.default_rng(1)
    context = rng.integers(3, V, size=9).tolist()  # longer than the sliding window (6)
    root = 5
    tree = _random_tree(Action(3, 2, 2), rng)
    kv = KVState(model)
    prefill(kv, context)
    logits, _ = target_tree_pass(kv, root, tree)
    assert logits.shape == (tree.num_nodes, V)
    for i in range(tree.num_nodes):
        expect = _full_logits(model, context + [root] + list(tree.path_tokens(i)))
        torch.testing.assert_close(logits[i], expect, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
@torch.inference_mode()
def test_pruned_caches_continue_like_a_fresh_forward(kind):
    target, draft = _small(kind, "sdpa", seed=0), _small(kind, "sdpa", seed=1)
    rng = np.random.default_rng(2)
    sampling = Sampling(1.0)
    context = rng.integers(3, V, size=7).tolist()
    root = 9
    kv_t, kv_d = KVState(target), KVState(draft)
    prefill(kv_t, context)
    q_logits = prefill(kv_d, context + [root])[0]
    q_root = to_numpy_rows(transform_logits(q_logits, sampling, V))
    action = Action(3, 2, 2)
    drafted = draft_tree(DraftRoot(kv_d, q_root), action, DraftRule(sampling, V), rng)
    tree = drafted.tree
    # the draft rows kept for verification equal the draft's own separate forwards
    for i in range(tree.num_nodes):
        if tree.children[i]:
            expect = transform_logits(_full_logits(draft, context + [root] + list(tree.path_tokens(i))), sampling)
            np.testing.assert_allclose(tree.q_rows[i], expect.double().numpy(), atol=ATOL)
    ctx_t = len(kv_t)
    target_tree_pass(kv_t, root, tree)
    for leaf in (4, tree.num_nodes - 1, 2):  # end of rollout 1 (a leaf), end of rollout 3, mid-trunk
        # prune copies of the caches to the path root -> leaf, then continue with an emitted token
        path = [leaf]
        while path[-1] > 0:
            path.append(int(tree.parents[path[-1]]))
        path = path[::-1]  # [0, ..., leaf]
        kt, kd = _clone(kv_t), _clone(kv_d)
        kt.keep(ctx_t, [ctx_t + i for i in path])
        fed = [i for i in path if i in drafted.node_slots]
        kd.keep(drafted.node_slots[0], [drafted.node_slots[i] for i in fed])
        accepted = [int(tree.tokens[i]) for i in path[1:]]
        emitted = 11
        seq = context + [root] + accepted + [emitted]
        pend_d = [int(tree.tokens[i]) for i in path if i not in drafted.node_slots] + [emitted]
        got_t = forward_nodes(kt, [emitted], [len(kt)], np.ones((1, len(kt) + 1), bool))[0][-1]
        got_d = prefill(kd, pend_d)[0]
        assert kt.positions == list(range(len(seq))) and kd.positions == list(range(len(seq)))
        torch.testing.assert_close(got_t, _full_logits(target, seq), atol=ATOL, rtol=0)
        torch.testing.assert_close(got_d, _full_logits(draft, seq), atol=ATOL, rtol=0)


def _clone(kv: KVState) -> KVState:
    out = KVState(kv.model)
    out.cache = copy.deepcopy(kv.cache)
    out.positions = list(kv.positions)
    return out


@pytest.mark.parametrize("kind", ["llama", "self_draft"])
def test_rows_give_those_rows_of_a_full_forward(kind):
    """``forward_nodes(rows=...)`` (collect's and lookup's prefills: only the roots' rows) returns exactly those
    rows of logits and hidden states, in the given order, whether the head skips the others (HF models and the
    self-draft take ``logits_to_keep``) or not; the cache holds every token either way."""
    from engine.tree_pass import causal_allowed
    from models.self_draft import SelfDraft, SelfDraftConfig

    model = _small("llama", "sdpa")
    if kind == "self_draft":
        model = SelfDraft(model, SelfDraftConfig(layers=2, adapter_width=16, vocab_subset_size=0),
                          vocab_subset=torch.arange(0, V, 2))
        with torch.no_grad():
            model.adapter.down.weight.normal_(0, 0.1)
        model.eval()
    tokens = torch.randint(0, V, (11,)).tolist()
    rows = [9, 2, 5]
    with torch.inference_mode():
        kv_all, kv_rows = KVState(model), KVState(model)
        assert kv_rows.keeps_logits
        full, h_full = forward_nodes(kv_all, tokens, list(range(11)), causal_allowed(0, 11), True)
        some, h_some = forward_nodes(kv_rows, tokens, list(range(11)), causal_allowed(0, 11), True, keep=rows)
    assert some.shape == (3, full.shape[1]) and h_some.shape == (3, h_full.shape[1])
    assert torch.allclose(some, full[rows], atol=ATOL) and torch.allclose(h_some, h_full[rows], atol=ATOL)
    assert len(kv_rows) == len(kv_all) == 11


def test_bool_mask_is_never_used():
    """The engine's masks are additive floats of the model dtype (boolean 4D masks break eager)."""
    from engine.tree_pass import attention_mask

    model = _small("llama", "eager")
    kv = KVState(model)
    mask = attention_mask(kv, np.array([[True, False], [True, True]]), [0, 1])
    assert mask.dtype == torch.float32 and mask.shape == (1, 1, 2, 2)
    assert mask[0, 0, 0, 1] == torch.finfo(torch.float32).min and mask[0, 0, 1, 0] == 0
