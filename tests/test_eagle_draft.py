"""The EAGLE-style draft head (`models.eagle_draft`): its 4-bit head, its artifact, and the engine paths that feed
it the target's features (drafting, the decode loop, collection). Losslessness with it: greedy identity and the
law of the first tokens through the real decode loop."""

import copy

import numpy as np
import pytest
import torch
from lossless_harness import PrefixOracle, chi_square_test, expected_law
from tiny_models import tiny_config
from transformers import LlamaForCausalLM

from data_collection.root_collector import RootCollector, UnionTrees
from decoding.actions import Action, ActionSpace
from decoding.sampling import Sampling
from engine.decoder import AUTOREGRESSIVE, SpeculativeDecoder
from engine.drafting import DraftRoot, DraftRule, draft_tree
from engine.torch_sampling import prob_rows
from models.draft_data import Continuations, distillation_records, position_stats
from models.draft_training import RecordDataset, distill_terms, unrolled_terms
from models.eagle_draft import EagleDraft, EagleDraftConfig, load_eagle_draft, quantize_rows
from models.gguf_blocks import QuantizedMatrix
from models.int4 import Int4Linear, Q8Linear
from models.self_draft import SelfDraft, SelfDraftConfig, SelfDraftError, load_self_draft, save_self_draft
from models.self_draft import target_fingerprint as fingerprint

VOCAB = 64
PROMPT = [5, 9, 33, 12, 40, 7]

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_target(seed: int = 1) -> LlamaForCausalLM:
    """A 3-layer random Llama, hidden 64 (two 4-bit blocks), untied head with structure."""
    torch.manual_seed(seed)
    config = tiny_config(3, hidden=64)
    config.tie_word_embeddings = False
    target = LlamaForCausalLM(config)
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
    return target.eval()


def eagle_of(target, seed: int = 2, subset: int = 48) -> EagleDraft:
    """An EAGLE head with random (untrained but not identity) weights over the first ``subset`` ids."""
    torch.manual_seed(seed)
    draft = EagleDraft(target, EagleDraftConfig(96, subset, target_fingerprint=fingerprint(target)))
    with torch.no_grad():
        for p in draft.adapter.parameters():
            p.normal_(0.0, 0.2)
    return draft.eval()


def own_samples(target) -> Continuations:
    """32 continuations of 24 tokens the target sampled after `PROMPT` (seed 0)."""
    torch.manual_seed(0)
    with torch.no_grad():
        out = target.generate(torch.tensor([PROMPT] * 32), do_sample=True, max_new_tokens=24, min_new_tokens=24,
                              pad_token_id=0, eos_token_id=None)
    return Continuations([PROMPT] * 32, [row[len(PROMPT):].tolist() for row in out])


def subset_positions(draft: EagleDraft) -> torch.Tensor:
    """``[VOCAB]``: each id's index in the draft's vocabulary subset, -1 outside it (the loss terms' lookup)."""
    pos = torch.full((VOCAB,), -1, dtype=torch.long)
    pos[draft.vocab_subset] = torch.arange(draft.vocab_subset.numel())
    return pos


def distilled(target, draft: EagleDraft, steps: int = 300) -> EagleDraft:
    """``draft`` fitted to ``target`` on its own samples (EAGLE records, the stage's loss terms): a draft whose
    greedy choice often agrees with the target's, so greedy tests exercise accepted drafts."""
    rec = distillation_records(target, own_samples(target), None, top_k=16)
    assert rec.hidden.shape == (32 * 24, 2 * 64)
    pos = subset_positions(draft)
    params = list(draft.adapter.parameters()) + [draft.head.bias]
    opt = torch.optim.Adam(params, lr=3e-3)
    draft.train()
    for _ in range(steps):
        kl, acc = distill_terms(draft, pos, rec.hidden.float(), rec.top_ids, rec.top_logp)
        opt.zero_grad()
        (kl + 1.0 - acc).backward()
        opt.step()
    return draft.eval()


@pytest.fixture(scope="module")
def pair():
    target = tiny_target()
    return target, distilled(target, eagle_of(target))


def test_the_4bit_head_is_the_dense_weight_it_trains_on():
    torch.manual_seed(0)
    w = torch.randn(64, 128) * 0.1
    codes, d, m, dense = quantize_rows(w)
    assert codes.max() <= 15 and (dense - w).abs().max() <= float(torch.tensor(d).max()) * 0.6  # a 4-bit grid
    x = torch.randn(3, 128).to(torch.bfloat16).float()  # the kernel's activations are bfloat16
    got, ref = Int4Linear(QuantizedMatrix("Q4_1", codes, d, m))(x), x @ dense.T
    assert torch.allclose(got, ref, rtol=2 ** -7, atol=1e-3)  # the kernel's output is rounded to bfloat16
    wrong_zero = x @ torch.from_numpy(codes.astype(np.float32) * np.repeat(d, 32, 1) + np.repeat(m, 32, 1)).T
    assert not torch.allclose(got, wrong_zero, rtol=2 ** -7, atol=1e-3)  # the check can fail


def test_artifact_round_trip_and_its_checks(pair, tmp_path):
    target, draft = pair
    save_self_draft(draft, tmp_path / "eagle")
    loaded = load_eagle_draft(target, tmp_path / "eagle")
    assert all(torch.equal(a, b) for a, b in zip(loaded.trained_state().values(), draft.trained_state().values(),
                                                 strict=True))
    # loaded for inference: fc and the adapter on Q8_0 blocks of the same weights (bfloat16 activations)
    assert all(isinstance(m, Q8Linear) for m in (loaded.adapter[0], loaded.adapter[1].up, loaded.adapter[1].down))
    h, ids = torch.randn(4, 64), torch.tensor([3, 8, 9, 30])
    with torch.inference_mode():
        got, ref = loaded.step(h, ids)[0], draft.step(h, ids)[0]
        assert torch.equal(got.isinf(), ref.isinf())
        finite = ~ref.isinf()
        gap = (got[finite] - ref[finite]).abs().max()
        assert 0 < gap <= 0.03 * ref[finite].abs().max()  # 8-bit weights, bfloat16 activations: close, not equal
        assert torch.equal(got, torch.cat([loaded.step(h[i:i + 1], ids[i:i + 1])[0] for i in range(4)]))
    with pytest.raises(SelfDraftError, match="different target"):
        load_eagle_draft(tiny_target(seed=7), tmp_path / "eagle")
    with pytest.raises(SelfDraftError, match="eagle:"):
        load_self_draft(target, tmp_path / "eagle")
    save_self_draft(SelfDraft(target, SelfDraftConfig(1, 16, 0, target_fingerprint=fingerprint(target))),
                    tmp_path / "self")
    with pytest.raises(SelfDraftError, match="self_draft:"):
        load_eagle_draft(target, tmp_path / "self")
    with pytest.raises(SelfDraftError, match="keeps no cache"):
        draft(input_ids=torch.tensor([PROMPT]), use_cache=True)


@torch.inference_mode()
def test_each_node_is_drafted_from_its_parents_feature(pair):
    """Drafting a tree below the root: a fed node's q row is the draft's step on (its parent's feature, its token),
    the root's parent feature being the target's feature before the root."""
    target, draft = pair
    sampling = Sampling(1.0)
    h_prev = target.model(input_ids=torch.tensor([PROMPT[:-1]])).last_hidden_state[0, -1]
    logits, f = draft.step(h_prev[None], torch.tensor([PROMPT[-1]]))
    root = DraftRoot(None, prob_rows(logits, sampling, VOCAB)[0], draft=draft, feature=f[0])
    drafted = draft_tree(root, Action(2, 1, 2), DraftRule(sampling, VOCAB), np.random.default_rng(0))
    tree = drafted.tree
    features = {0: f[0]}
    for node in range(1, tree.parents.shape[0]):
        if not tree.q_rows[node].any():  # a leaf: never fed
            continue
        row_logits, feat = draft.step(features[int(tree.parents[node])][None], torch.tensor([int(tree.tokens[node])]))
        features[node] = feat[0]
        assert np.allclose(tree.q_rows[node], prob_rows(row_logits, sampling, VOCAB)[0], atol=1e-6), node
    assert drafted.forwards == 2  # the trunk token, then the two rollouts' first tokens as one step


@pytest.mark.parametrize("method,action", [("traversal", Action(2, 1, 2)), ("specinfer", Action(3, 0, 2)),
                                           ("naive", Action(1, 3, 0)), ("khisti", Action(2, 0, 1))])
def test_greedy_identity(pair, method, action):
    target, draft = pair
    decoder = SpeculativeDecoder(target, draft, VOCAB)
    ar = decoder.generate(PROMPT, 12, AUTOREGRESSIVE, sampling=Sampling(0.0))
    res = decoder.generate(PROMPT, 12, method, action, Sampling(0.0))
    assert res.tokens == ar.tokens
    assert res.stats.steps < 12  # drafts were accepted


def test_one_token_prompt(pair):
    target, draft = pair
    res = SpeculativeDecoder(target, draft, VOCAB).generate([5], 6, "traversal", Action(2, 1, 1), Sampling(1.0))
    assert len(res.tokens) == 6


def test_the_decode_loop_samples_the_target_law(pair):
    """The real decode loop with the EAGLE draft, one sample per seed: the law of the first 2 tokens against the
    target's (chi-square, p > 0.001; 400 samples detect a TV shift of ~17% with probability 0.9)."""
    target, draft = pair
    sampling = Sampling(0.8, 0.95)
    law = expected_law(PrefixOracle(target, copy.deepcopy(target), PROMPT, sampling, VOCAB), 2, 6)
    decoder = SpeculativeDecoder(target, draft, VOCAB)
    samples = [tuple(decoder.generate(PROMPT, 2, "traversal", Action(2, 1, 1), sampling, seed=s).tokens)
               for s in range(400)]
    pval, bins = chi_square_test(samples, law)
    assert bins >= 3 and pval > 1e-3


@torch.inference_mode()
def test_collection_drafts_what_the_decoder_drafts(pair):
    """The collection's root rows (one prefill, features of every root at once) equal the decoder's root step
    at the same context, for the root and for the token before it."""
    target, draft = pair
    sampling = Sampling(1.0)
    seq = PROMPT + [20, 21, 22, 23, 24, 25]
    collector = RootCollector(target, draft, VOCAB, ActionSpace(range(1, 3), range(0, 2), range(0, 2)), ["traversal"], UnionTrees(1))
    positions = [6, 9]
    feats = collector.features(seq, positions, sampling)
    decoder = SpeculativeDecoder(target, draft, VOCAB)
    for i, r in enumerate(positions):
        state = decoder.start(seq[: r + 1], sampling)
        q, _ = decoder.draft_root(state, sampling, hidden=False)  # the row before the root too (prev=True)
        assert np.allclose(feats["q_root"][i], q, atol=1e-5), r
        assert np.allclose(feats["q_prev"][i], state.q_prev, atol=1e-5), r
    rows = collector.collect(seq, positions, sampling, "key")
    assert len(rows.position) == 2 and np.isfinite(np.stack(rows.labels["traversal"])).all()


# ---- the embedded SmolLM2 target (int4 backend) with an EAGLE head of the default shape, random weights ----

@pytest.fixture(scope="module")
def smol_eagle(smollm2_pair):
    target = smollm2_pair.target
    torch.manual_seed(3)
    draft = EagleDraft(target, EagleDraftConfig(2048, 16384, target_fingerprint=fingerprint(target)))
    with torch.no_grad():
        draft.adapter[0].weight.normal_(0.0, 0.03)
    from models.eagle_draft import for_inference

    return for_inference(draft)


@pytest.mark.integration
@pytest.mark.parametrize("method,action", [("traversal", Action(2, 1, 2)), ("specinfer", Action(3, 0, 1))])
def test_greedy_identity_smollm2(smollm2_pair, smol_eagle, method, action):
    tok = smollm2_pair.tokenizer
    ids = tok("def is_prime(n):\n    ")["input_ids"]
    decoder = SpeculativeDecoder(smollm2_pair.target, smol_eagle, smollm2_pair.vocab_size)
    ar = decoder.generate(ids, 12, AUTOREGRESSIVE, sampling=Sampling(0.0))
    res = decoder.generate(ids, 12, method, action, Sampling(0.0))
    assert res.tokens == ar.tokens
    assert sum(res.stats.depth_offered[1:]) > 0  # drafted trees were verified (an untrained head's are rejected)


@pytest.mark.integration
def test_the_decode_loop_samples_the_target_law_smollm2(smollm2_pair, smol_eagle):
    """First 2 tokens through the real decode loop (300 seeds) against the target's law: with an untrained head
    nearly every draft is rejected, so this checks the residual draws of the verifier on the real rows."""
    tok = smollm2_pair.tokenizer
    prompt = tok("The capital of France is")["input_ids"]
    sampling = Sampling(1.0)
    target = smollm2_pair.target
    law = expected_law(PrefixOracle(target, target, prompt, sampling, smollm2_pair.vocab_size, chunk=128), 2, 6)
    decoder = SpeculativeDecoder(target, smol_eagle, smollm2_pair.vocab_size)
    samples = [tuple(decoder.generate(prompt, 2, "traversal", Action(2, 0, 1), sampling, seed=s).tokens)
               for s in range(300)]
    pval, bins = chi_square_test(samples, law)
    assert bins >= 3 and pval > 1e-3


@torch.inference_mode()
def test_unrolled_logits_are_the_decoders_chain(pair):
    """Depth d at position t is the chain the decoder drafts: the first token from the target's feature d - 1
    positions back, then the head's own features (`step`), the sequence's tokens as the drafted ones."""
    target, draft = pair
    ids = torch.tensor([PROMPT + [3, 17, 22, 8]])
    by_depth = draft.unrolled_logits(ids, 3)
    assert torch.equal(by_depth[0], draft(input_ids=ids).logits)  # depth 1 is teacher forcing
    feats = target.model(input_ids=ids).last_hidden_state[0]  # [n, H]
    for t in range(3, ids.shape[1]):
        h = feats[t - 3 : t - 2]  # the target's feature before the chain's first token, ids[t - 2]
        for d in range(3):
            logits, h = draft.step(h, ids[0, t - 2 + d : t - 1 + d])
        assert torch.allclose(by_depth[2][0, t], logits[0], atol=1e-5)
    assert not torch.allclose(by_depth[1], by_depth[0], atol=1e-3)  # own features differ from the target's

    data = Continuations([PROMPT], [[3, 17, 22, 8]])
    stats = position_stats(target, draft, data, [1.0], depth=3)[1.0]
    assert len(stats.deeper) == 2 and stats.deeper[1][0].shape == (4,)
    assert stats.deeper[1][0][-1] < 1.0 and stats.deeper[1][0][-1] > 0.0
    assert position_stats(target, draft, data, [1.0])[1.0].deeper == []  # depth 1: nothing deeper


def test_unrolled_records_stay_inside_a_continuation_and_match_the_chain(pair):
    """An unrolled training example is a run of consecutive positions of one continuation; its depth-1 terms are
    the plain terms of its first record, its deeper inputs the next records' embedding halves."""
    target, draft = pair
    data = Continuations([PROMPT, PROMPT[:3]], [[3, 17, 22, 8, 9], [4, 5, 6]])
    rec = distillation_records(target, data, None, top_k=8)
    runs = RecordDataset(rec.hidden, rec.top_ids, rec.top_logp, rec.record_seq, unroll=3)
    assert len(runs) == (5 - 2) + (3 - 2)  # no run crosses from one continuation into the next
    hidden, next_embeds, top_ids, top_logp = runs[[0, 3]]
    assert next_embeds.shape == (2, 2, 64) and top_ids.shape == (2, 3, 8)
    assert torch.equal(next_embeds[1, 1], rec.hidden[7, 64:].float())  # the second continuation's third record
    assert torch.equal(top_ids[1], rec.top_ids[5:8])
    pos = subset_positions(draft)
    with torch.no_grad():
        terms = unrolled_terms(draft, pos, (hidden, next_embeds, top_ids, top_logp))
        flat = distill_terms(draft, pos, hidden, top_ids[:, 0], top_logp[:, 0])
    assert len(terms) == 3 and torch.allclose(terms[0][0], flat[0]) and torch.allclose(terms[0][1], flat[1])
    with pytest.raises(ValueError, match="record_seq"):
        RecordDataset(rec.hidden, rec.top_ids, rec.top_logp, unroll=2)


def test_training_time_test_raises_the_deeper_acceptance():
    """Unrolled training (depth 2 scored on the head's own feature) fits depth 2 better than teacher forcing alone,
    from the same start and the same steps."""
    target = tiny_target()
    rec = distillation_records(target, own_samples(target), None, top_k=16)
    runs = RecordDataset(rec.hidden, rec.top_ids, rec.top_logp, rec.record_seq, unroll=2)
    batch = runs[list(range(len(runs)))]
    depth2 = {}
    for unroll in (1, 2):
        draft = eagle_of(target)
        pos = subset_positions(draft)
        opt = torch.optim.Adam(list(draft.adapter.parameters()) + [draft.head.bias], lr=3e-3)
        draft.train()
        for _ in range(150):
            terms = unrolled_terms(draft, pos, batch)[:unroll]
            loss = sum(kl + 1.0 - acc for kl, acc in terms)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            depth2[unroll] = float(unrolled_terms(draft.eval(), pos, batch)[1][1])
    assert depth2[2] > depth2[1] + 0.02, depth2
