"""Half precision (bfloat16, float16) on CPU, on tiny random-weight models: what a GPU user's bf16 pair relies on.

- The tree pass's additive mask is in the model's dtype (0 allowed, ``finfo(dtype).min`` blocked, nothing infinite),
  and every row of one tree pass matches a plain causal forward of that node's path: max abs difference of the
  probabilities (float32 softmax of the logits, T = 1) below ``PROB_TOL`` (bf16 5e-4, fp16 1.5e-4; measured 1.4e-4
  and 4.1e-5). The same tokens fed as one causal chunk (siblings seeing each other) miss it by 5x or more
  (5.1e-3, checked): the tolerance is tight enough to catch a wrong mask.
- Greedy identity for every method against autoregressive decoding in the same dtype. Two code paths may round a
  logit differently by an ulp (a tree pass of n tokens vs one token at a time run different matmul shapes), so
  when the target's top two logits are that close either token is right: the outputs must agree up to the first
  such near-tie (both tokens' logits within ``TIE_EPS * eps * |top|``, 2-4 units in the last place, of the top
  logit) and agree completely in at least one of two runs per method. The measured divergences were 1 ulp apart.
- Labels from half-precision rows stay exact: rows become float64 after a float32 softmax (sums to 1 within
  1e-12), and the union-tree labels of every method equal the reference DP on the same rows within 1e-12.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import VOCAB, generate, untied_pair

from decoding.actions import Action, ActionSpace
from decoding.labels import reference_union_labels, union_labels
from decoding.method_names import METHOD_NAMES
from decoding.sampling import Sampling
from decoding.tree import build_tree, tree_layout
from decoding.union_tree import sample_union_tree
from engine.cache import KVState
from engine.decoder import AUTOREGRESSIVE, SpeculativeDecoder
from engine.torch_sampling import prob_rows
from engine.tree_pass import (
    attention_mask,
    causal_allowed,
    forward_nodes,
    prefill,
    target_tree_pass,
    tree_allowed,
)

DTYPES = [torch.bfloat16, torch.float16]
PROB_TOL = {torch.bfloat16: 5e-4, torch.float16: 1.5e-4}  # tree-pass rows vs causal forward, max abs prob diff
TIE_EPS = 2  # a near-tie: both logits within TIE_EPS * eps(dtype) * |top logit| (2-4 ulps) of the top
T1 = Sampling(1.0)
CHAIN_ONLY = {"naive", "bv"}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def half_pair(request):
    target, draft = untied_pair(seed=0, noise=0.3)
    return target.to(request.param), draft.to(request.param), request.param


def _random_tree(action: Action, rng: np.random.Generator):
    parents, _ = tree_layout(action)
    tokens = rng.integers(3, VOCAB, size=parents.shape[0])
    tokens[0] = -1
    return build_tree(action, tokens, np.full((parents.shape[0], VOCAB), 1.0 / VOCAB))


@torch.inference_mode()
def _causal_probs(model, ids: list[int]) -> torch.Tensor:
    """float32 probabilities after ``ids`` from one plain forward (no cache, the model's own causal mask)."""
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float().softmax(-1)


@torch.inference_mode()
def test_tree_mask_is_additive_in_the_model_dtype(half_pair):
    target, _, dtype = half_pair
    kv = KVState(target)
    prefill(kv, [5, 9, 33])
    parents, _ = tree_layout(Action(2, 1, 2))
    mask = attention_mask(kv, tree_allowed(len(kv), parents), [3, 4, 5, 6, 5, 6])
    assert mask.dtype == dtype and mask.shape == (1, 1, 6, 9)
    assert torch.isfinite(mask).all()
    blocked = torch.finfo(dtype).min
    assert set(mask.unique().tolist()) == {0.0, blocked}
    # node 2 (the first rollout's first token) sees the context, the root, the trunk node and itself only
    assert (mask[0, 0, 2] == 0).tolist() == [True] * 3 + [True, True, True, False, False, False]


@torch.inference_mode()
def test_tree_pass_rows_match_a_causal_forward(half_pair):
    target, _, dtype = half_pair
    rng = np.random.default_rng(1)
    context, root = rng.integers(3, VOCAB, size=9).tolist(), 5
    tree = _random_tree(Action(3, 2, 2), rng)
    kv = KVState(target)
    prefill(kv, context)
    logits, _ = target_tree_pass(kv, root, tree)
    assert logits.dtype == dtype
    expect = [_causal_probs(target, context + [root] + list(tree.path_tokens(i))) for i in range(tree.num_nodes)]
    worst = max(float((logits[i].float().softmax(-1) - expect[i]).abs().max()) for i in range(tree.num_nodes))
    assert worst < PROB_TOL[dtype], f"{dtype}: tree-pass rows differ from causal forwards by {worst:.2e}"
    # power: the same tokens fed as one causal chunk (siblings see each other) miss the tolerance by far
    kv_wrong = KVState(target)
    prefill(kv_wrong, context)
    tokens = [root, *tree.tokens[1:].tolist()]
    n = len(tokens)
    wrong, _ = forward_nodes(kv_wrong, tokens, (len(context) + tree.depths).tolist(), causal_allowed(len(context), n))
    miss = max(float((wrong[i].float().softmax(-1) - expect[i]).abs().max()) for i in range(n))
    assert miss > 5 * PROB_TOL[dtype], f"a sibling-visible mask differs by only {miss:.2e}"


@pytest.fixture(scope="module")
def greedy_runs(half_pair):
    """Autoregressive greedy outputs of two prompts in the pair's dtype (computed once)."""
    target, draft, _ = half_pair
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, VOCAB, size=5).tolist() for _ in range(2)]
    return [(p, generate(target, draft, p, 24, method=AUTOREGRESSIVE, sampling=Sampling(0.0)).tokens)
            for p in prompts]


@torch.inference_mode()
def _first_divergence_is_a_near_tie(target, dtype, prompt, ar: list[int], sp: list[int]) -> bool:
    """Whether the outputs agree up to a position where the target's logits of both tokens are within
    ``TIE_EPS * eps * |top|`` of the top logit (each path may round that tie its own way)."""
    k = next((i for i, (a, b) in enumerate(zip(ar, sp, strict=True)) if a != b), None)
    if k is None:
        return True
    logits = target(input_ids=torch.tensor([prompt + ar[:k]]), use_cache=False).logits[0, -1].float()
    top = float(logits.max())
    tol = TIE_EPS * torch.finfo(dtype).eps * max(abs(top), 1.0)
    return top - float(logits[ar[k]]) <= tol and top - float(logits[sp[k]]) <= tol


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_greedy_identity_for_every_method(half_pair, greedy_runs, method):
    target, draft, dtype = half_pair
    action = Action(1, 1, 3) if method in CHAIN_ONLY else Action(3, 1, 3)
    identical = 0
    for prompt, ar in greedy_runs:
        sp = generate(target, draft, prompt, 24, method=method, policy=action, sampling=Sampling(0.0), seed=1)
        assert len(sp.tokens) == len(ar)
        assert _first_divergence_is_a_near_tie(target, dtype, prompt, ar, sp.tokens), (method, ar, sp.tokens)
        assert sp.stats.steps < len(ar)  # drafts were accepted
        identical += sp.tokens == ar
    assert identical >= 1, f"{method} {dtype}: no run identical to autoregressive"


@torch.inference_mode()
def test_labels_from_half_precision_rows_are_exact(half_pair):
    target, draft, dtype = half_pair
    context = [5, 9, 33, 12, 7]
    space = ActionSpace(K=[1, 2], L1=[0, 1], L2=[0, 2])

    def q_row(prefix: tuple[int, ...]) -> np.ndarray:
        logits = draft(input_ids=torch.tensor([context + list(prefix)]), use_cache=False).logits[0, -1]
        assert logits.dtype == dtype
        return prob_rows(logits, T1, VOCAB)

    union = sample_union_tree(space, lambda prefix: q_row(prefix), np.random.default_rng(0))
    kv = KVState(target)
    prefill(kv, context[:-1])
    logits, _ = target_tree_pass(kv, context[-1], union.tree)
    p_rows = prob_rows(logits, T1, VOCAB)  # [n, V]
    assert logits.dtype == dtype and p_rows.dtype == np.float64
    np.testing.assert_allclose(p_rows.sum(-1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(union.tree.q_rows[union.tree.q_rows.sum(-1) > 0].sum(-1), 1.0, rtol=0, atol=1e-12)
    values, _ = union_labels(union, p_rows, METHOD_NAMES)
    for name in METHOD_NAMES:
        ref = reference_union_labels(union, p_rows, name)
        np.testing.assert_array_equal(np.isnan(values[name]), np.isnan(ref))
        np.testing.assert_allclose(values[name], ref, rtol=0, atol=1e-12, err_msg=name)
        sizes = np.array([a.L1 + a.L2 for a in space.actions], dtype=float)
        ok = ~np.isnan(ref)
        assert np.all((ref[ok] >= 1.0) & (ref[ok] <= 1.0 + sizes[ok] + 1e-12)), name


@pytest.mark.integration
def test_greedy_identity_on_the_embedded_pair_in_bfloat16():
    """SmolLM2-135M loaded in bfloat16 (as `model.dtype: bfloat16` loads it) with a noisy-copy draft: one chat
    prompt, 16 greedy tokens, Traversal on a (2, 1, 2) tree equal to autoregressive decoding (up to a near-tie;
    token-identical on our CPU; "Write a haiku about rain." diverges at a 1-ulp tie, 0.125 at logit ~20)."""
    from engine_helpers import noisy_draft

    from models.loading import load_model, load_tokenizer

    spec = "embedded:smollm2-135m-instruct"
    target = load_model(spec, torch.device("cpu"), torch.bfloat16)
    tok = load_tokenizer(spec)
    enc = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    prompt = [int(t) for t in enc]
    draft = noisy_draft(target, 0.5)
    assert next(target.parameters()).dtype == torch.bfloat16 and next(draft.parameters()).dtype == torch.bfloat16
    vocab = target.get_output_embeddings().weight.shape[0]

    decoder = SpeculativeDecoder(target, draft, vocab)
    ar = decoder.generate(prompt, 16, AUTOREGRESSIVE, sampling=Sampling(0.0)).tokens
    sp = decoder.generate(prompt, 16, "traversal", Action(2, 1, 2), Sampling(0.0))
    assert _first_divergence_is_a_near_tie(target, torch.bfloat16, prompt, ar, sp.tokens), (ar, sp.tokens)
    assert sp.stats.steps < len(ar)
    print(f"bf16 SmolLM2: identical {sp.tokens == ar}, {sp.stats.steps} target passes for {len(ar)} tokens")


@pytest.fixture(scope="module")
def half_self_draft(half_pair):
    """The default draft's kind over the pair's target: a `SelfDraft` (2 shared layers, a non-trivial adapter and
    bias) in the pair's dtype, on the HF decoder layers (the lean path runs CPU float32 only; ``lean`` off too)."""
    from models.self_draft import SelfDraft, SelfDraftConfig

    target, _, dtype = half_pair
    torch.manual_seed(0)
    draft = SelfDraft(target, SelfDraftConfig(layers=2, adapter_width=16, vocab_subset_size=0))
    with torch.no_grad():
        draft.adapter.down.weight.normal_(0, 0.05)
        draft.head.bias.normal_(0, 0.3)
    draft.lean = False
    assert draft.dtype == dtype
    return draft.eval()


@torch.inference_mode()
def test_self_draft_on_hf_layers_fills_its_cache(half_pair, half_self_draft):
    """The HF layers get the cache under the keyword their transformers version reads (5.17 ``past_key_values``,
    5.25 ``cache``): a cached forward fills it, and incremental logits match a full forward."""
    from transformers import DynamicCache

    _, _, dtype = half_pair
    ids = torch.tensor([[5, 9, 33, 12, 7, 40, 41]])
    full = half_self_draft(input_ids=ids, use_cache=False).logits[0].float().softmax(-1)  # [7, V]
    cache = DynamicCache()
    half_self_draft(input_ids=ids[:, :5], past_key_values=cache, use_cache=True)
    assert cache.get_seq_length() == 5
    inc = [half_self_draft(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits[0, -1]
           for i in (5, 6)]
    assert cache.get_seq_length() == 7
    worst = max(float((row.float().softmax(-1) - full[i]).abs().max()) for row, i in zip(inc, (5, 6), strict=True))
    assert worst < PROB_TOL[dtype], f"{dtype}: cached self-draft rows differ from a full forward by {worst:.2e}"


@pytest.mark.parametrize("method", ["traversal", "naive"])
def test_greedy_identity_with_the_self_draft_on_hf_layers(half_pair, half_self_draft, greedy_runs, method):
    """The engine decodes with the self-draft in half precision on the HF-layer path (a GPU user's default draft,
    which failed at its first step on transformers 5.17: its layers never filled the cache): greedy identity as
    for `test_greedy_identity_for_every_method`."""
    target, _, dtype = half_pair
    action = Action(1, 1, 3) if method in CHAIN_ONLY else Action(2, 1, 2)
    identical = 0
    for prompt, ar in greedy_runs:
        sp = generate(target, half_self_draft, prompt, 24, method=method, policy=action, sampling=Sampling(0.0))
        assert len(sp.tokens) == len(ar)
        assert _first_divergence_is_a_near_tie(target, dtype, prompt, ar, sp.tokens), (method, ar, sp.tokens)
        identical += sp.tokens == ar
    assert identical >= 1, f"{method} {dtype}: no run identical to autoregressive"
