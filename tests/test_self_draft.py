"""The self-speculative draft on the tiny random pair: call convention, caches, masks, artifact, training."""

from __future__ import annotations

import pytest
import torch
from tiny_models import TINY_VOCAB, tiny_lm
from transformers import DynamicCache

from decoding.sampling import Sampling
from models.draft_data import (
    Continuations,
    PositionStats,
    acceptance_per_position,
    breakdown,
    chain_block_efficiency,
    distillation_records,
    position_stats,
)
from models.draft_training import (
    DistillDataModule,
    RecordDataset,
    distill_terms,
    fit_draft,
    rank_vocabulary,
)
from models.fast_path import PackedLinear
from models.hf_compat import cache_kwargs
from models.sampler import Row, sample_continuations
from models.self_draft import SelfDraft, SelfDraftConfig, SelfDraftError, load_self_draft, save_self_draft
from pipeline.sections import TrainDraftConfig
from pipeline.train_draft import distill_hparams


def config(layers=2, width=16, subset=0):
    return SelfDraftConfig(layers=layers, adapter_width=width, vocab_subset_size=subset)

SUBSET = torch.tensor([0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 60, 63])


@pytest.fixture(scope="module")
def target():
    return tiny_lm(4, seed=0, hidden=48)


def make_draft(target, k=2, subset=SUBSET, width=16, seed=0):
    torch.manual_seed(seed)
    draft = SelfDraft(target, config(k, width), vocab_subset=subset)
    with torch.no_grad():  # a non-trivial adapter and bias (a fresh adapter is the identity)
        draft.adapter.down.weight.normal_(0, 0.1)
        draft.head.bias.normal_(0, 0.5)
    return draft.eval()


def test_call_convention_and_zero_outside_subset(target):
    draft = make_draft(target)
    ids = torch.randint(0, TINY_VOCAB, (2, 7))
    out = draft(input_ids=ids, use_cache=True)
    assert out.logits.shape == (2, 7, TINY_VOCAB)
    assert isinstance(out.past_key_values, DynamicCache) and out.past_key_values.get_seq_length() == 7
    q = torch.softmax(out.logits / 0.7, -1)
    outside = torch.ones(TINY_VOCAB, dtype=torch.bool)
    outside[SUBSET] = False
    assert torch.all(q[..., outside] == 0)  # exactly zero, not just small
    assert torch.allclose(q.sum(-1), torch.ones(2, 7))
    assert torch.all(q[..., SUBSET] > 0)
    sub, _ = draft.subset_logits(ids, use_cache=False)
    assert torch.equal(sub, out.logits[..., SUBSET])


def test_logits_to_keep_computes_only_the_kept_positions(target):
    """HF's ``logits_to_keep``: an int keeps the last positions, a 1D tensor those positions (in its order,
    repeats allowed); the rows equal the full forward's, and the hidden states still cover every position."""
    draft = make_draft(target)
    ids = torch.randint(0, TINY_VOCAB, (1, 9))
    full = draft(input_ids=ids, use_cache=False, output_hidden_states=True)
    last = draft(input_ids=ids, use_cache=False, logits_to_keep=2).logits
    rows = torch.tensor([6, 0, 3, 3])
    some = draft(input_ids=ids, use_cache=False, output_hidden_states=True, logits_to_keep=rows)
    assert last.shape == (1, 2, TINY_VOCAB) and some.logits.shape == (1, 4, TINY_VOCAB)
    assert torch.allclose(last[..., SUBSET], full.logits[:, -2:, SUBSET], atol=1e-6)
    assert torch.allclose(some.logits[..., SUBSET], full.logits[:, rows][..., SUBSET], atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(some.hidden_states, full.hidden_states, strict=True))


def test_cache_matches_full_forward(target):
    draft = make_draft(target)
    ids = torch.randint(0, TINY_VOCAB, (1, 9))
    full = draft(input_ids=ids, use_cache=False).logits
    cache = DynamicCache()
    draft(input_ids=ids[:, :5], past_key_values=cache, use_cache=True)
    two = draft(input_ids=ids[:, 5:7], past_key_values=cache, use_cache=True).logits  # causal, n > 1
    one = [draft(input_ids=ids[:, i : i + 1], past_key_values=cache, use_cache=True).logits for i in (7, 8)]
    inc = torch.cat([two, *one], dim=1)
    assert torch.allclose(inc[..., SUBSET], full[:, 5:, SUBSET], atol=1e-5)
    assert cache.get_seq_length() == 9


def test_4d_tree_mask_reproduces_separate_passes(target):
    """Two sibling tokens after a cached context: additive 4D mask + explicit positions (engine convention)."""
    draft = make_draft(target)
    ctx = torch.randint(0, TINY_VOCAB, (1, 6))
    a, b = 11, 40
    cache = DynamicCache()
    draft(input_ids=ctx, past_key_values=cache, use_cache=True)
    blocked = torch.finfo(torch.float32).min
    mask = torch.zeros(1, 1, 2, 8)
    mask[0, 0, 0, 7] = blocked  # a does not see b
    mask[0, 0, 1, 6] = blocked  # b does not see a
    tree = draft(input_ids=torch.tensor([[a, b]]), attention_mask=mask, position_ids=torch.tensor([[6, 6]]),
                 past_key_values=cache, use_cache=True).logits
    for j, tok in enumerate((a, b)):
        ref = draft(input_ids=torch.cat([ctx, torch.tensor([[tok]])], 1), use_cache=False).logits[:, -1]
        assert torch.allclose(tree[:, j, SUBSET], ref[:, SUBSET], atol=1e-5)
    bool_mask = mask == 0
    cache.crop(-2)
    tree_b = draft(input_ids=torch.tensor([[a, b]]), attention_mask=bool_mask, position_ids=torch.tensor([[6, 6]]),
                   past_key_values=cache, use_cache=True).logits
    assert torch.allclose(tree_b[..., SUBSET], tree[..., SUBSET], atol=1e-6)


def test_save_load_round_trip_and_errors(target, tmp_path):
    draft = make_draft(target)
    from models.self_draft import target_fingerprint

    draft.config_draft.target_fingerprint = target_fingerprint(target)
    folder = save_self_draft(draft, tmp_path / "draft")
    assert sorted(p.name for p in folder.iterdir()) == ["adapter.safetensors", "config.json"]
    assert not list(tmp_path.glob("*.tmp*"))
    loaded = load_self_draft(target, folder)  # on CPU: adapter and head prepacked (models/fast_path.py)
    assert isinstance(loaded.head, PackedLinear) and isinstance(loaded.adapter.up, PackedLinear)
    ids = torch.randint(0, TINY_VOCAB, (1, 5))
    with torch.inference_mode():
        got, want = loaded(input_ids=ids).logits, draft(input_ids=ids).logits
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.allclose(got[..., SUBSET], want[..., SUBSET], atol=1e-5)
    with pytest.raises(SelfDraftError, match="different target"):
        load_self_draft(tiny_lm(4, seed=7, hidden=48), folder)
    with pytest.raises(SelfDraftError, match="no draft artifact"):
        load_self_draft(target, tmp_path / "missing")
    with pytest.raises(SelfDraftError, match="between 1 and"):
        SelfDraft(target, config(layers=5))


def test_collect_digest_is_weights_and_config_not_bookkeeping(target, tmp_path):
    """Collect keys its dataset on `draft_digest`: a retrain to the same weights (other seconds, another MLflow run)
    must keep it, other weights or another config must change it."""
    from pipeline.collect import draft_digest

    draft = make_draft(target)
    a = draft_digest(save_self_draft(draft, tmp_path / "a", extra={"train_seconds": 1.0, "mlflow_run_id": "x"}))
    b = draft_digest(save_self_draft(draft, tmp_path / "b", extra={"train_seconds": 2.0, "mlflow_run_id": "y"}))
    assert a == b
    with torch.no_grad():
        next(draft.adapter.parameters()).add_(1e-3)
    assert draft_digest(save_self_draft(draft, tmp_path / "c")) != a
    other = make_draft(target)
    other.config_draft.adapter_width += 1  # the config alone differs (same weights file)
    assert draft_digest(save_self_draft(other, tmp_path / "d")) != a
    with pytest.raises(SelfDraftError, match="no draft artifact"):
        draft_digest(tmp_path / "missing")


def test_full_depth_identity_draft_accepts_everything(target):
    """k = all layers, whole vocabulary, identity adapter, zero bias: q == p, acceptance 1."""
    draft = SelfDraft(target, config(layers=4, width=8)).eval()
    ids = torch.randint(0, TINY_VOCAB, (1, 8))
    assert torch.allclose(draft(input_ids=ids).logits, target(input_ids=ids).logits, atol=1e-5)


def sampled(target, n_new=6):
    """Target-sampled continuations of three prompts (the trajectories stage's sampler)."""
    prompts = [[5, 9, 11, 40, 3], [7, 8], [12, 13, 14, 15, 16, 17, 18, 19]]
    rows = [Row(p, Sampling(1.0), seed=i) for i, p in enumerate(prompts)]
    return Continuations(prompts, sample_continuations(target, rows, n_new, eos=[2], batch_size=2))


def incremental_records(target, prompt, cont, layer, top_k):
    """What the retired sampler captured while decoding ``cont`` token by token on a KV cache: the hidden
    state after ``layer`` and the top-k log-probs (T = 1) at the last position of each step."""
    captured = []
    hook = target.model.layers[layer - 1].register_forward_hook(lambda _m, _i, o: captured.append(o[:, -1]))
    cache, rows, step = DynamicCache(), [], torch.tensor([prompt])
    try:
        for tok in cont:
            logits = target(input_ids=step, use_cache=True, **cache_kwargs(target, cache)).logits[0, -1]
            top_lp, top_id = torch.log_softmax(logits, -1).topk(top_k)
            rows.append((captured[-1][0].half(), top_id, top_lp))
            step = torch.tensor([[tok]])
    finally:
        hook.remove()
    return [torch.stack(c) for c in zip(*rows, strict=True)]


@torch.no_grad()
def test_teacher_forced_records_equal_the_incremental_capture(target, one_thread):
    data = sampled(target)
    data.continuations.append([])  # an empty continuation contributes no record
    data.prompts.append([4, 4])
    rec = distillation_records(target, data, layer=2, top_k=8, batch_size=2)
    assert rec.num_records == sum(len(c) for c in data.continuations)
    assert rec.hidden.dtype == torch.float16 and rec.top_ids.shape == (rec.num_records, 8)
    for i, (prompt, cont) in enumerate(zip(data.prompts[:3], data.continuations[:3], strict=True)):
        hidden, top_ids, top_logp = incremental_records(target, prompt, cont, 2, 8)
        mine = rec.record_seq == i
        assert torch.allclose(rec.hidden[mine].float(), hidden.float(), atol=2e-3)
        assert torch.equal(rec.top_ids[mine], top_ids)
        assert torch.allclose(rec.top_logp[mine], top_logp, atol=1e-4)
    # the recorded hidden state is the draft's own hidden state after layer 2 (up to float16 rounding)
    ids = torch.tensor([data.prompts[0] + data.continuations[0]])
    h = make_draft(target).hidden_after_layers(ids, use_cache=False)[0, len(data.prompts[0]) - 1 : -1]
    assert torch.allclose(rec.hidden[rec.record_seq == 0].float(), h, atol=1e-2)


def test_acceptance_and_target_entropy(target):
    data = sampled(target)
    draft = make_draft(target)
    acc = acceptance_per_position(target, draft, data, [1.0, 0.6])
    assert [len(a) for a in acc[1.0]] == [len(c) for c in data.continuations]
    assert all(((a >= 0) & (a <= 1 + 1e-6)).all() for a in acc[0.6])
    # one-token chains: 1 + mean acceptance over the roots with a token ahead
    roots = torch.cat([a[:-1] for a in acc[1.0]])
    assert chain_block_efficiency(acc[1.0], 1) == pytest.approx(1.0 + float(roots.mean()))
    # the target entropy reported next to it is the entropy of p_T at the same positions
    stats = position_stats(target, draft, data, [0.6])[0.6]
    assert all(torch.equal(a, b) for a, b in zip(stats.acceptance, acc[0.6], strict=True))
    ids = torch.tensor([data.prompts[0] + data.continuations[0]])
    logp = torch.log_softmax(target(input_ids=ids).logits[0, len(data.prompts[0]) - 1 : -1] / 0.6, -1)
    assert torch.allclose(stats.target_entropy[0], -(logp.exp() * logp).sum(-1), atol=1e-5)
    # T = 0 (greedy, no division by zero): acceptance 1 where the argmaxes agree, else 0; entropy 0
    greedy = position_stats(target, draft, data, [0.0])[0.0]
    p_arg = target(input_ids=ids).logits[0, len(data.prompts[0]) - 1 : -1].argmax(-1)
    q_arg = draft(input_ids=ids).logits[0, len(data.prompts[0]) - 1 : -1].argmax(-1)
    assert torch.equal(greedy.acceptance[0], (p_arg == q_arg).float())
    assert torch.equal(greedy.target_entropy[0], torch.zeros_like(greedy.target_entropy[0]))
    # top-p truncation is applied to p and q alike: a tiny top-p is greedy
    assert torch.allclose(position_stats(target, draft, data, [1.0], top_p=1e-6)[1.0].acceptance[0],
                          greedy.acceptance[0])


def test_chain_block_efficiency_by_hand():
    """Roots t with a full chain of n ahead; a chain accepts its first j tokens w.p. prod_{i<j} a[t+i]."""
    acc = [torch.tensor([0.5, 0.5, 0.5, 0.5]), torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.9])]
    # n = 2: roots 0, 1 of the first (1 + 0.5 + 0.25 each), root 0 of the second (1 + 1 + 0); none in the third
    assert chain_block_efficiency(acc, 2) == pytest.approx((1.75 + 1.75 + 2.0) / 3)
    # a second depth's acceptance replaces the first below the chain's first token
    deeper = [[torch.tensor([0.2, 0.2, 0.2, 0.2]), torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.0])]]
    # roots 0, 1 of the first: 1 + 0.5 + 0.5 * 0.2; root 0 of the second: 1 + 1 * (1 + 1.0)
    assert chain_block_efficiency(acc, 2, deeper) == pytest.approx((1.6 + 1.6 + 3.0) / 3)
    assert chain_block_efficiency(acc, 0) == 1.0


def test_breakdown_groups_positions_by_source_and_target_entropy():
    stats = PositionStats(acceptance=[torch.tensor([1.0, 0.5]), torch.tensor([0.2]), torch.zeros(0)],
                          target_entropy=[torch.tensor([0.1, 2.0]), torch.tensor([4.0]), torch.zeros(0)])
    out = breakdown(stats, ["code", "prose", "empty"])
    assert out["by_source"] == {"code": {"acceptance": 0.75, "positions": 2},
                                "prose": {"acceptance": pytest.approx(0.2), "positions": 1}}
    assert out["by_target_entropy_nats"] == {"[0, 0.5)": {"acceptance": 1.0, "positions": 1},
                                             "[1.5, 3)": {"acceptance": 0.5, "positions": 1},
                                             "[3, inf)": {"acceptance": pytest.approx(0.2), "positions": 1}}


def records(target, k, n_seq=24, length=12, top_k=TINY_VOCAB, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, TINY_VOCAB, (n_seq, length), generator=gen)
    with torch.no_grad():
        hidden = SelfDraft(target, config(k)).hidden_after_layers(ids, use_cache=False)
        top_lp, top_id = torch.log_softmax(target(input_ids=ids).logits, -1).topk(top_k, -1)
    return RecordDataset(hidden.reshape(-1, 48).half(), top_id.reshape(-1, top_k), top_lp.reshape(-1, top_k))


def test_training_reduces_kl(target):
    train, val = records(target, 2, seed=0), records(target, 2, seed=1)
    subset = rank_vocabulary(train.top_ids, train.top_logp, TINY_VOCAB, 48, always=[2])
    assert subset.numel() == 48 and 2 in subset.tolist()
    draft = SelfDraft(target, config(2, 32), vocab_subset=subset)
    from models.draft_training import DraftDistillation

    probe = DraftDistillation(draft, distill_hparams(TrainDraftConfig()))
    before = distill_terms(draft, probe.pos_in_subset, val.hidden.float(), val.top_ids, val.top_logp)
    target_before = [p.clone() for p in target.parameters()]
    hparams = distill_hparams(TrainDraftConfig(lr=3e-3, steps=150, warmup_steps=5, tv_weight=1.0, val_every=30))
    fit_draft(draft, DistillDataModule(train, val, batch_size=64), hparams)
    after = distill_terms(draft, probe.pos_in_subset, val.hidden.float(), val.top_ids, val.top_logp)
    assert after[0] < 0.9 * before[0] and after[1] > before[1], (before, after)
    assert all(torch.equal(a, b) for a, b in zip(target_before, target.parameters(), strict=True))


def test_training_runs_in_bfloat16():
    """A bf16 pair (a GPU's default dtype): float32 records train the bf16 adapter (the GPU smoke's CPU twin failed
    at train_draft's first step with 'mat1 and mat2 must have the same dtype, but got Float and BFloat16')."""
    bf16 = tiny_lm(4, seed=0, hidden=48).to(torch.bfloat16)
    train, val = records(bf16, 2, n_seq=8, seed=0), records(bf16, 2, n_seq=4, seed=1)
    draft = SelfDraft(bf16, config(2, 32), vocab_subset=SUBSET)
    before = draft.adapter.up.weight.detach().clone()
    for negatives in (0, 4):
        hparams = distill_hparams(TrainDraftConfig(steps=3, warmup_steps=1, negatives=negatives, val_every=3))
        fit_draft(draft, DistillDataModule(train, val, batch_size=32), hparams)
    assert draft.adapter.up.weight.dtype == torch.bfloat16 and not torch.equal(draft.adapter.up.weight, before)


def test_sampled_softmax_is_exact_when_negatives_cover_the_rest(target):
    data = records(target, 2, n_seq=4, length=6, top_k=8)
    draft = make_draft(target)
    from models.draft_training import DraftDistillation

    pos = DraftDistillation(draft, distill_hparams(TrainDraftConfig())).pos_in_subset
    batch = (data.hidden.float(), data.top_ids, data.top_logp)
    exact = distill_terms(draft, pos, *batch, negatives=0)
    sampled = distill_terms(draft, pos, *batch, negatives=SUBSET.numel() - 1)  # all of S \ U
    assert torch.allclose(torch.stack(exact), torch.stack(sampled), atol=1e-5)


def test_output_hidden_states(target):
    draft = make_draft(target)
    out = draft(input_ids=torch.randint(0, TINY_VOCAB, (1, 4)), output_hidden_states=True)
    assert out.hidden_states[-1].shape == (1, 4, 48)
