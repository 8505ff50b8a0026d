"""Draft distillation data (teacher-forced from stored trajectories) and the draft's token acceptance.

Terms:
- *continuation*: tokens the target sampled after a (chat-formatted) prompt, stopping at EOS; sampled once
  by stage trajectories (`models.sampler`, stored by `data_collection.trajectory_store`) and only read here.
- *distillation record*: one continuation position t: the draft's input at t (stored float16: the target's
  hidden state after layer k, [H], for the self-draft; ``[h_{t-1}, e(x_t)]``, [2H], the target's final feature
  one position back and the input embedding of token t, for the EAGLE head of `models.eagle_draft`) and the
  target's top-K next-token log-probabilities at T = 1 (ids [K] and log-probs [K]). Full-vocabulary rows are never stored. Records come from teacher forcing: one forward
  of prompt + continuation per sequence, never from sampling again.
- *token acceptance* at a sampling setting: ``sum_x min(p(x), q(x))`` where p, q are the target and draft
  next-token distributions after the same sampling transform (`decoding.sampling.transform_logits`); q is
  0 outside the draft's vocabulary subset (renormalized over it). It is the probability that standard
  speculative sampling accepts one drafted token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from decoding.sampling import Sampling
from engine.torch_sampling import transform_logits


@dataclass
class Continuations:
    """Prompts and their continuations (token id lists), aligned."""

    prompts: list[list[int]] = field(default_factory=list)
    continuations: list[list[int]] = field(default_factory=list)


@dataclass
class DistillRecords:
    """Distillation records of a `Continuations`, in sequence order, then position order."""

    hidden: torch.Tensor  # [N, H] (or [N, 2H] for the EAGLE head) float16, the draft's input
    top_ids: torch.Tensor  # [N, K] int64, target's top-K next-token ids (T = 1)
    top_logp: torch.Tensor  # [N, K] float32, their log-probabilities
    record_seq: torch.Tensor  # [N] int64, index of the continuation each record belongs to

    @property
    def num_records(self) -> int:
        return int(self.hidden.shape[0])


@torch.no_grad()
def distillation_records(
    target: nn.Module,
    data: Continuations,
    layer: int | None,
    top_k: int = 64,
    batch_size: int = 8,
    progress: str | None = None,
) -> DistillRecords:
    """Teacher forcing: records for every position that predicts a continuation token (the last prompt
    token through the second-to-last continuation token), ``len(continuation)`` records per sequence.
    The draft's input: the hidden states after the target's layer ``layer``, or (``layer=None``) the inputs of
    the EAGLE head (module docstring).

    Sequences of similar length share a right-padded batch (under the causal mask no real position sees
    the padding, so no attention mask is needed); the LM head runs on the recorded positions only.
    """
    from tqdm.auto import tqdm

    device = next(target.parameters()).device
    head = target.get_output_embeddings()
    captured: list[torch.Tensor] = []
    eagle = layer is None
    hook = None if eagle else target.model.layers[layer - 1].register_forward_hook(
        lambda _m, _i, o: captured.append(o[0] if isinstance(o, tuple) else o)
    )
    embed = target.get_input_embeddings()
    seqs = [i for i, c in enumerate(data.continuations) if c]
    seqs.sort(key=lambda i: len(data.prompts[i]) + len(data.continuations[i]))
    parts: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    try:
        for start in tqdm(range(0, len(seqs), batch_size), desc=progress, disable=progress is None,
                          unit="batch", mininterval=2.0):
            idx = seqs[start : start + batch_size]
            full = [data.prompts[i] + data.continuations[i] for i in idx]
            ids = torch.zeros((len(idx), max(map(len, full))), dtype=torch.long)  # [b, L], right-padded
            for r, seq in enumerate(full):
                ids[r, : len(seq)] = torch.tensor(seq)
            captured.clear()
            final = target.model(input_ids=ids.to(device), use_cache=False).last_hidden_state  # [b, L, H]
            if eagle:  # [h_{t-1}, e(x_t)], a zero feature before the first token
                prev = torch.cat([torch.zeros_like(final[:, :1]), final[:, :-1]], dim=1)
                hidden = torch.cat([prev, embed(ids.to(device))], dim=-1)  # [b, L, 2H]
            else:
                hidden = captured[-1]  # [b, L, H] after layer k
            for r, i in enumerate(idx):
                lp, lc = len(data.prompts[i]), len(data.continuations[i])
                span = slice(lp - 1, lp + lc - 1)
                logp = torch.log_softmax(head(final[r, span]).float(), -1)  # [lc, V]
                top_lp, top_id = logp.topk(top_k, dim=-1)  # [lc, K]
                parts[i] = (hidden[r, span].to(torch.float16).cpu(), top_id.cpu(), top_lp.cpu())
    finally:
        if hook is not None:
            hook.remove()
    order = sorted(parts)
    if not order:
        raise ValueError("no continuation has a token: nothing to distill from")
    return DistillRecords(
        hidden=torch.cat([parts[i][0] for i in order]),
        top_ids=torch.cat([parts[i][1] for i in order]).long(),
        top_logp=torch.cat([parts[i][2] for i in order]),
        record_seq=torch.cat([torch.full((parts[i][0].shape[0],), i, dtype=torch.long) for i in order]),
    )


@dataclass
class PositionStats:
    """One tensor per continuation of `Continuations` (empty for an empty one), one entry per position that
    predicts a continuation token."""

    acceptance: list[torch.Tensor] = field(default_factory=list)  # sum_x min(p_T, q_T)
    target_entropy: list[torch.Tensor] = field(default_factory=list)  # entropy of p_T in nats
    # a draft that reads its own features below the first token (`models.eagle_draft`): the acceptance at depth
    # 2, 3, ... (`EagleDraft.unrolled_logits`), one list per depth like `acceptance`; empty for a draft whose
    # deeper tokens see what teacher forcing shows it (a draft with its own cache: the sequence's tokens)
    deeper: list[list[torch.Tensor]] = field(default_factory=list)


@torch.no_grad()
def continuation_logits(model: nn.Module, prompt: list[int], cont: list[int], device, depth: int = 0):
    """``[Lc, V]`` float logits of ``model`` at the positions predicting ``cont`` after ``prompt`` (one forward of
    the whole sequence, no cache); with ``depth`` > 0 (a draft with ``unrolled_logits``) a list of them, one per
    draft depth 1..``depth``."""
    ids = torch.tensor([prompt + cont], device=device)  # [1, Lp + Lc]
    span = slice(len(prompt) - 1, len(prompt) + len(cont) - 1)
    if depth:
        return [z[0, span].float() for z in model.unrolled_logits(ids, depth)]
    return model(input_ids=ids, use_cache=False).logits[0, span].float()


def position_stats(
    target: nn.Module, draft: nn.Module, data: Continuations, temperatures: list[float], top_p: float = 1.0,
    depth: int = 1,
) -> dict[float, PositionStats]:
    """For each T: token acceptance and target entropy at every position that predicts a continuation token,
    with p and q after the sampling transform (T, then ``top_p``; T = 0 is greedy: one-hot rows).

    Both models see the whole sequence (prompt + continuation) in one forward; the draft through its
    ordinary call (`forward`), so a prepacked / vocabulary-subset draft is measured as it decodes. With
    ``depth`` > 1, a draft that drafts deeper tokens from its own features (``unrolled_logits``) is also measured
    at depths 2..``depth`` (`PositionStats.deeper`).
    """
    device = next(target.parameters()).device
    unrolls = depth > 1 and hasattr(draft, "unrolled_logits")
    out = {t: PositionStats(deeper=[[] for _ in range(depth - 1)] if unrolls else []) for t in temperatures}
    for prompt, cont in zip(data.prompts, data.continuations, strict=True):
        if not cont:
            for t in temperatures:
                for rows in (out[t].acceptance, out[t].target_entropy, *out[t].deeper):
                    rows.append(torch.zeros(0))
            continue
        p_logits = continuation_logits(target, prompt, cont, device)  # [Lc, V]
        if unrolls:
            q_by_depth = continuation_logits(draft, prompt, cont, device, depth)  # depth x [Lc, V]
        else:
            q_by_depth = [continuation_logits(draft, prompt, cont, device)]  # [Lc, V], -inf outside S
        vocab = min(p_logits.shape[-1], q_by_depth[0].shape[-1])
        for t in temperatures:
            sampling = Sampling(t, top_p)
            p = transform_logits(p_logits, sampling, vocab)
            acc = [torch.minimum(p, transform_logits(q, sampling, vocab)).sum(-1).cpu() for q in q_by_depth]
            out[t].acceptance.append(acc[0])  # [Lc]
            for rows, a in zip(out[t].deeper, acc[1:], strict=True):
                rows.append(a)
            out[t].target_entropy.append(torch.special.entr(p).sum(-1).cpu())  # [Lc], nats
    return out


def acceptance_per_position(
    target: nn.Module, draft: nn.Module, data: Continuations, temperatures: list[float], top_p: float = 1.0
) -> dict[float, list[torch.Tensor]]:
    """For each T, one tensor per continuation: `position_stats`' acceptance only."""
    return {t: s.acceptance for t, s in position_stats(target, draft, data, temperatures, top_p).items()}


ENTROPY_BUCKETS = (0.0, 0.5, 1.5, 3.0)  # nats: lower edges of the target-entropy buckets of `breakdown`


def breakdown(stats: PositionStats, groups: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """Mean acceptance and position count by group (e.g. prompt source; ``groups[i]`` names continuation i)
    and by bucket of target entropy: where the draft fails."""
    acc, ent = torch.cat(stats.acceptance), torch.cat(stats.target_entropy)
    labels = [g for g, a in zip(groups, stats.acceptance, strict=True) for _ in range(len(a))]
    by_group = {}
    for g in sorted(set(groups)):
        m = torch.tensor([label == g for label in labels], dtype=torch.bool)
        if m.any():
            by_group[g] = {"acceptance": float(acc[m].mean()), "positions": int(m.sum())}
    by_entropy = {}
    edges = [*ENTROPY_BUCKETS, float("inf")]
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        m = (ent >= lo) & (ent < hi)
        if m.any():
            by_entropy[f"[{lo:g}, {hi:g})"] = {"acceptance": float(acc[m].mean()), "positions": int(m.sum())}
    return {"by_source": by_group, "by_target_entropy_nats": by_entropy}


def chain_block_efficiency(acceptance: list[torch.Tensor], draft_len: int,
                           deeper: list[list[torch.Tensor]] = ()) -> float:
    """Expected tokens per target pass of chain drafting with ``draft_len`` tokens, from per-position acceptance.

    A chain whose first token is drafted at position t accepts its first j tokens with probability
    ``prod_{i<j} a_{i+1}[t+i]`` (positions along the target's own trajectory stand in for the drafted ones), where
    ``a_1`` is ``acceptance`` and ``a_d`` for d >= 2 is ``deeper[d - 2]`` (the last one given stands for every
    depth beyond it; none given: ``acceptance`` at every depth); block efficiency = 1 + sum over j of that
    product. Averaged over all roots with a full chain ahead.
    """
    values = chain_efficiencies(acceptance, draft_len, deeper)
    return sum(values) / max(len(values), 1)


def chain_efficiencies(acceptance: list[torch.Tensor], draft_len: int,
                       deeper: list[list[torch.Tensor]] = ()) -> list[float]:
    """`chain_block_efficiency` at every root with a full chain ahead, in order (continuation by continuation)."""
    by_depth = [acceptance, *deeper]
    values = []
    for c in range(len(acceptance)):
        rows = [by_depth[min(d, len(by_depth) - 1)][c] for d in range(draft_len)]  # depth d + 1 at every position
        for t in range(0, len(acceptance[c]) - draft_len):
            chain = torch.tensor([float(rows[d][t + d]) for d in range(draft_len)], dtype=torch.float64)
            values.append(1.0 + float(torch.cumprod(chain, 0).sum()))
    return values
