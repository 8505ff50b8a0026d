"""Target-generated continuations for draft distillation, and the draft's token acceptance.

Terms:
- *continuation*: tokens sampled from the target after a (chat-formatted) prompt, stopping at EOS.
- *distillation record*: one continuation position t: the target's hidden state after layer k at t
  ([H], stored float16) and the target's top-K next-token log-probabilities at T = 1 (ids [K] and
  log-probs [K]). Full-vocabulary rows are never stored.
- *token acceptance* at temperature T: ``sum_x min(p_T(x), q_T(x))`` where p_T, q_T are the target and draft
  next-token distributions after the same temperature transform; q_T is 0 outside the draft's
  vocabulary subset (renormalized over it). It is the probability that standard speculative sampling
  accepts one drafted token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Continuations:
    """Prompts and sampled continuations (token id lists), plus distillation records when captured."""

    prompts: list[list[int]] = field(default_factory=list)
    continuations: list[list[int]] = field(default_factory=list)
    hidden: torch.Tensor | None = None  # [N, H] float16, hidden state after layer k
    top_ids: torch.Tensor | None = None  # [N, K] int64, target's top-K next-token ids (T = 1)
    top_logp: torch.Tensor | None = None  # [N, K] float32, their log-probabilities
    record_seq: torch.Tensor | None = None  # [N] int64, index of the continuation each record belongs to

    def state(self) -> dict:
        return {k: getattr(self, k) for k in ("prompts", "continuations", "hidden", "top_ids", "top_logp",
                                              "record_seq")}

    @property
    def num_records(self) -> int:
        return 0 if self.hidden is None else int(self.hidden.shape[0])


def eos_ids(tokenizer, target) -> set[int]:
    """Token ids that end a continuation: the tokenizer's EOS and the target's generation-config EOS."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    ids |= set(gen if isinstance(gen, list) else [gen])
    return {int(i) for i in ids if i is not None}


@torch.no_grad()
def sample_continuations(
    target: nn.Module,
    tokenizer,
    texts: list[str],
    max_new_tokens: int,
    temperature: float = 1.0,
    batch_size: int = 16,
    seed: int = 0,
    capture_layer: int | None = None,
    top_k: int = 64,
    max_prompt_tokens: int = 512,
    progress: str | None = None,
) -> Continuations:
    """Sample one continuation per text from ``target`` (KV-cached, left-padded batches).

    With ``capture_layer = k`` also return distillation records for every continuation position
    (including the last prompt token, which predicts the first continuation token). ``progress``: a
    label for a progress bar on stderr counting sampled tokens (None: no bar).
    """
    from tqdm.auto import tqdm
    from transformers import DynamicCache

    device = next(target.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    eos = eos_ids(tokenizer, target)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"][-max_prompt_tokens:] for t in texts]
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))  # similar lengths share a batch
    out_cont: list[list[int] | None] = [None] * len(texts)
    records: dict[int, list] = {}
    captured: list[torch.Tensor] = []
    hook = None
    if capture_layer is not None:
        hook = target.model.layers[capture_layer - 1].register_forward_hook(
            lambda _m, _i, o: captured.append((o[0] if isinstance(o, tuple) else o)[:, -1].detach())
        )
    bar = tqdm(total=len(texts) * max_new_tokens, desc=progress, unit="tok", disable=progress is None,
               mininterval=2.0)
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            b, width = len(idx), max(len(encoded[i]) for i in idx)
            ids = torch.full((b, width), pad, dtype=torch.long)
            mask = torch.zeros((b, width), dtype=torch.long)
            for r, i in enumerate(idx):
                ids[r, width - len(encoded[i]) :] = torch.tensor(encoded[i])
                mask[r, width - len(encoded[i]) :] = 1
            ids, mask = ids.to(device), mask.to(device)
            pos = (mask.cumsum(-1) - 1).clamp_min(0)  # [b, width]
            cache = DynamicCache()
            done = torch.zeros(b, dtype=torch.bool)
            conts: list[list[int]] = [[] for _ in range(b)]
            step_in, step_pos = ids, pos
            for _ in range(max_new_tokens):
                captured.clear()
                logits = target(input_ids=step_in, attention_mask=mask, position_ids=step_pos, cache=cache,
                                use_cache=True, logits_to_keep=1).logits[:, -1].float().cpu()  # [b, V]
                if capture_layer is not None:
                    logp = torch.log_softmax(logits, -1)
                    top_lp, top_id = logp.topk(top_k, dim=-1)  # [b, K]
                    hid = captured[-1].to(torch.float16).cpu()  # [b, H]
                    for r in range(b):
                        if not done[r]:
                            records.setdefault(idx[r], []).append((hid[r], top_id[r], top_lp[r]))
                if temperature == 0:
                    nxt = logits.argmax(-1)
                else:
                    nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)[:, 0]
                bar.update(int((~done).sum()))
                for r in range(b):
                    if not done[r]:
                        conts[r].append(int(nxt[r]))
                        done[r] = int(nxt[r]) in eos
                if bool(done.all()):
                    break
                step_in = nxt.to(device)[:, None]
                step_pos = step_pos[:, -1:] + 1
                mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=device)], dim=1)
            for r, i in enumerate(idx):
                out_cont[i] = conts[r]
            bar.total -= sum(max_new_tokens - len(c) for c in conts)  # rows that stopped early at EOS
            bar.refresh()
    finally:
        bar.close()
        if hook is not None:
            hook.remove()
    result = Continuations(prompts=encoded, continuations=[c or [] for c in out_cont])
    if capture_layer is not None:
        rows = [(i, rec) for i in range(len(texts)) for rec in records.get(i, [])]
        result.hidden = torch.stack([r[1][0] for r in rows])
        result.top_ids = torch.stack([r[1][1] for r in rows]).long()
        result.top_logp = torch.stack([r[1][2] for r in rows])
        result.record_seq = torch.tensor([r[0] for r in rows], dtype=torch.long)
    return result


@dataclass
class PositionStats:
    """One tensor per continuation of `Continuations` (empty for an empty one), one entry per position that
    predicts a continuation token."""

    acceptance: list[torch.Tensor] = field(default_factory=list)  # sum_x min(p_T, q_T)
    target_entropy: list[torch.Tensor] = field(default_factory=list)  # entropy of p_T in nats


@torch.no_grad()
def position_stats(
    target: nn.Module, draft: nn.Module, data: Continuations, temperatures: list[float]
) -> dict[float, PositionStats]:
    """For each T: token acceptance and target entropy at every position that predicts a continuation token.

    Both models see the whole sequence (prompt + continuation) in one forward; the draft through its
    ordinary call (`forward`), so an int8 / vocabulary-subset draft is measured as it decodes.
    """
    device = next(target.parameters()).device
    out = {t: PositionStats() for t in temperatures}
    for prompt, cont in zip(data.prompts, data.continuations, strict=True):
        if not cont:
            for t in temperatures:
                out[t].acceptance.append(torch.zeros(0))
                out[t].target_entropy.append(torch.zeros(0))
            continue
        ids = torch.tensor([prompt + cont], device=device)  # [1, Lp + Lc]
        span = slice(len(prompt) - 1, len(prompt) + len(cont) - 1)  # positions predicting the continuation
        p_logits = target(input_ids=ids, use_cache=False).logits[0, span].float()  # [Lc, V]
        q_logits = draft(input_ids=ids, use_cache=False).logits[0, span].float()  # [Lc, V], -inf outside S
        vocab = min(p_logits.shape[-1], q_logits.shape[-1])
        for t in temperatures:
            logp = torch.log_softmax(p_logits[:, :vocab] / t, -1)
            p, q = logp.exp(), torch.softmax(q_logits[:, :vocab] / t, -1)
            out[t].acceptance.append(torch.minimum(p, q).sum(-1).cpu())  # [Lc]
            out[t].target_entropy.append(-(p * logp.clamp_min(-1e4)).sum(-1).cpu())  # [Lc]
    return out


def acceptance_per_position(
    target: nn.Module, draft: nn.Module, data: Continuations, temperatures: list[float]
) -> dict[float, list[torch.Tensor]]:
    """For each T, one tensor per continuation: `position_stats`' acceptance only."""
    return {t: s.acceptance for t, s in position_stats(target, draft, data, temperatures).items()}


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


def chain_block_efficiency(acceptance: list[torch.Tensor], draft_len: int) -> float:
    """Expected tokens per target pass of chain drafting with ``draft_len`` tokens, from per-position acceptance.

    A chain rooted at position t accepts its first j tokens with probability ``prod_{i<j} a[t+i]`` (positions
    along the target's own trajectory stand in for the drafted ones); block efficiency = 1 + sum over j of
    that product. Averaged over all roots with a full chain ahead.
    """
    values = []
    for a in acceptance:
        for t in range(0, len(a) - draft_len):
            values.append(1.0 + float(torch.cumprod(a[t : t + draft_len].double(), 0).sum()))
    return sum(values) / max(len(values), 1)


def cached_continuations(cache_dir, target, tokenizer, texts: list[str], **kwargs) -> Continuations:
    """`sample_continuations` memoized on disk under ``cache_dir`` by a hash of its inputs and the target."""
    import hashlib
    import json
    import os
    from pathlib import Path

    from models.self_draft import target_fingerprint

    # batch_size changes which valid sample is drawn, not what is sampled; progress changes nothing:
    # neither is part of the key
    keyed = {k: v for k, v in kwargs.items() if k not in ("batch_size", "progress")}
    key_src = json.dumps({"texts": texts, "kwargs": keyed, "target": target_fingerprint(target)}, sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"continuations-{key}.pt"
    if path.is_file():
        return Continuations(**torch.load(path, weights_only=True))
    data = sample_continuations(target, tokenizer, texts, **kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(data.state(), tmp)
    os.replace(tmp, path)
    return data
