"""Batched, seeded sampling of continuations from one LM: THE sampler of the project's data stages.

Terms:
- *row*: one continuation to sample: the prompt's token ids, a sampling setting (`decoding.sampling.Sampling`:
  temperature then top-p; temperature 0 = greedy) and its own seed.
- *continuation*: the tokens drawn after the prompt, ending with the first EOS id (kept) or after
  ``max_new_tokens``.

Each step applies the engine's transform (`transform_logits`) to the last position's logits and draws the
token by inverse CDF (`draw`) from the row's own ``numpy.random.Generator(seed)``: a row's continuation
depends on its prompt, setting and seed only, not on which rows share its batch (up to float rounding of
batched matrix products). Rows of one setting and similar prompt lengths share a left-padded batch with
one KV cache; the padding mask is preallocated (no per-step concatenation of it) and only the last
position's logits are computed (``logits_to_keep=1``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from decoding.sampling import Sampling, draw
from engine.torch_sampling import to_numpy_rows, transform_logits
from models.hf_compat import cache_kwargs


@dataclass(frozen=True)
class Row:
    """One continuation to sample."""

    prompt: list[int]  # token ids of the (chat-formatted) prompt
    sampling: Sampling
    seed: int


@torch.no_grad()
def sample_continuations(
    model: nn.Module,
    rows: Sequence[Row],
    max_new_tokens: int,
    eos: Collection[int],
    batch_size: int = 32,
    progress: str | None = None,
) -> list[list[int]]:
    """The continuation of every row, in the order of ``rows``.

    ``eos``: ids that end a continuation (e.g. `models.loading.eos_ids`). Left padding holds the smallest EOS
    id (masked out: no real position sees it, so its value changes nothing). ``progress``: a label for a progress bar on
    stderr counting sampled tokens, with ETA (None: no bar).
    """
    from tqdm.auto import tqdm

    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, not {max_new_tokens}")
    if any(not r.prompt for r in rows):
        raise ValueError("every row needs a non-empty prompt")
    eos = {int(i) for i in eos}
    pad = min(eos, default=0)
    out: list[list[int]] = [[] for _ in rows]
    bar = tqdm(total=len(rows) * max_new_tokens, desc=progress, unit="tok", disable=progress is None,
               mininterval=2.0)
    try:
        for idx in _batches(rows, batch_size):
            conts = _sample_batch(model, [rows[i] for i in idx], max_new_tokens, eos, pad, bar)
            for i, cont in zip(idx, conts, strict=True):
                out[i] = cont
    finally:
        bar.close()
    return out


def _batches(rows: Sequence[Row], batch_size: int) -> list[list[int]]:
    """Row indices grouped by setting, then by prompt length (similar lengths share a batch)."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i].sampling.temperature, rows[i].sampling.top_p,
                                                    len(rows[i].prompt), i))
    batches, current = [], []
    for i in order:
        if current and (len(current) == batch_size or rows[current[0]].sampling != rows[i].sampling):
            batches.append(current)
            current = []
        current.append(i)
    return batches + ([current] if current else [])


def _sample_batch(model, rows: list[Row], max_new: int, eos: set[int], pad: int, bar) -> list[list[int]]:
    from transformers import DynamicCache

    device = next(model.parameters()).device
    sampling = rows[0].sampling
    rngs = [np.random.default_rng(r.seed) for r in rows]
    b, width = len(rows), max(len(r.prompt) for r in rows)
    ids = torch.full((b, width), pad, dtype=torch.long)
    mask = torch.zeros((b, width + max_new), dtype=torch.long)  # [b, width + max_new], filled as we go
    for r, row in enumerate(rows):
        ids[r, width - len(row.prompt):] = torch.tensor(row.prompt)
        mask[r, width - len(row.prompt): width] = 1
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask[:, :width].cumsum(-1) - 1).clamp_min(0)  # [b, width]
    cache = DynamicCache()
    done = [False] * b
    conts: list[list[int]] = [[] for _ in range(b)]
    step_in, length = ids, width
    for _ in range(max_new):
        logits = model(input_ids=step_in, attention_mask=mask[:, :length], position_ids=pos,
                       use_cache=True, logits_to_keep=1, **cache_kwargs(model, cache)).logits[:, -1]  # [b, V]
        probs = to_numpy_rows(transform_logits(logits, sampling))  # [b, V] float64
        nxt = [pad if done[r] else int(draw(probs[r], rngs[r])[0, 0]) for r in range(b)]
        active = [r for r in range(b) if not done[r]]
        for r in active:
            conts[r].append(nxt[r])
            done[r] = nxt[r] in eos
        bar.update(len(active))
        if all(done):
            break
        mask[:, length] = 1
        length += 1
        step_in = torch.tensor(nxt, device=device)[:, None]  # [b, 1]
        pos = pos[:, -1:] + 1
    bar.total -= sum(max_new - len(c) for c in conts)  # rows that stopped early at EOS
    bar.refresh()
    return conts
