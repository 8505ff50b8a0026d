"""EAGLE-style draft head: the next token from the target's last hidden state and the token just sampled.

Terms used here:

- *feature*: a hidden state in the target's output space, the final norm's output, which the target's LM head
  turns into p. The target's tree pass computes one per node anyway (`engine.tree_pass`).
- *draft step*: ``f = norm(adapter(fc([h_prev, e(x)])))``, ``q = softmax(head(f))``, where ``h_prev`` is the
  feature of the token before ``x`` and ``e(x)`` the target's input embedding of ``x``. At the root, ``h_prev`` is
  the target's own feature at the root's predecessor (the row the root was sampled from); below the root it is
  the draft's feature of the parent node (EAGLE, Li et al. 2024, feeds its own predicted features the same way).
  No attention and no cache: a draft step is one small MLP and the head, whatever the context length.
- *head*: the rows S (FR-Spec subset, ranked on the distillation records) of the target's LM head, stored
  4-bit (blocks of 32 along the hidden axis, ``w = (c - 8) * d + z``) and on CPU computed with the target
  backend's 4-bit kernel (`models.int4.Int4Linear`), plus a trained logit bias over S. Outside S, q = 0.

What is trained (models/draft_training.py, the self-draft's distillation with this module in its place): ``fc``
(2H -> H), the residual MLP adapter and the logit bias. The embedding, the final norm and the head rows are the
target's and stay frozen. fc and the adapter train in float32; at inference on CPU float32 they compute from Q8_0
blocks of their trained weights on the same 4-bit kernel (`for_inference`). The distillation records' input is
``[h_prev, e(x)]`` ([2H] per position, `models.draft_data.distillation_records` with ``inputs="eagle"``).

The module answers two calls:
- `step`: what the decoder and the collection call (features and tokens in, subset logits and features out);
- `forward`: the HF causal-LM convention over whole sequences without a cache (the target is run on the same
  ids to get the features), so the acceptance measurements that teacher-force a draft read this one as they read
  any other (`models.draft_data.position_stats`).

The artifact is a folder like the self-draft's (`models.self_draft.save_self_draft`): ``config.json``
(`EagleDraftConfig`, with the target's fingerprint) and ``adapter.safetensors``. Load it with
`load_eagle_draft(target, folder)` or the draft spec ``eagle:<folder>`` (`models.loading`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models.self_draft import ResidualAdapter, SelfDraftError, _Output

KIND = "eagle"
FORMAT_VERSION = 1


@dataclass
class EagleDraftConfig:
    """The head's shape. No defaults for the trained knobs: stage train_draft builds it from its config."""

    adapter_width: int  # hidden width of the residual MLP after fc
    vocab_subset_size: int  # N: tokens the head scores (FR-Spec); 0 = whole vocabulary
    hidden_size: int = 0  # filled from the target
    vocab_size: int = 0  # the target's output vocabulary
    target_fingerprint: dict | None = None  # `models.self_draft.target_fingerprint`
    kind: str = KIND
    format_version: int = FORMAT_VERSION


def quantize_rows(w: torch.Tensor, block: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray, torch.Tensor]:
    """4-bit codes of ``w`` ``[N, K]`` in blocks of ``block`` along K (min/max per block): ``(codes [N, K] uint8,
    d [N, K / block], m [N, K / block], the dense weight the 4-bit kernel computes)``. The kernel reads its scale
    ``d`` and zero ``m + 8 d`` in bfloat16 (`models.int4`), so the dense weight is built from those roundings:
    training on it trains the function the decoder runs."""
    n, k = w.shape
    if k % block:
        raise SelfDraftError(f"hidden size {k} is not a multiple of the 4-bit block size {block}")
    blocks = w.detach().float().cpu().reshape(n, k // block, block)
    lo, hi = blocks.amin(-1), blocks.amax(-1)  # [N, K / block]
    d = ((hi - lo) / 15).clamp_min(1e-8)
    codes = torch.round((blocks - lo[..., None]) / d[..., None]).clamp(0, 15)
    d_k = d.to(torch.bfloat16).float()
    zero_k = (lo + 8 * d).to(torch.bfloat16).float()
    dense = ((codes - 8) * d_k[..., None] + zero_k[..., None]).reshape(n, k)
    return codes.to(torch.uint8).reshape(n, k).numpy(), d.numpy(), lo.numpy(), dense


class EagleDraft(nn.Module):
    """The draft head (module docstring). Trainable parts: ``adapter`` (fc + residual MLP) and ``head.bias``."""

    reads_target_hidden = True  # the decoder hands it the target's features (`engine.decoder`)

    def __init__(self, target: nn.Module, config: EagleDraftConfig, vocab_subset: torch.Tensor | None = None):
        super().__init__()
        head = target.get_output_embeddings().weight  # [V, H]
        config.hidden_size, config.vocab_size = int(head.shape[1]), int(head.shape[0])
        if vocab_subset is None:
            vocab_subset = torch.arange(min(config.vocab_subset_size or config.vocab_size, config.vocab_size))
        vocab_subset = vocab_subset.to(torch.long).cpu()
        if vocab_subset.numel() == 0 or int(vocab_subset.max()) >= config.vocab_size or int(vocab_subset.min()) < 0:
            raise SelfDraftError(f"vocabulary subset must hold ids in [0, {config.vocab_size})")
        h = config.hidden_size
        self.config_draft = config
        self.config = target.config  # HF-style config (read for the vocabulary and the architecture)
        self.embed_tokens = target.get_input_embeddings()  # shared, frozen
        self.final_norm = target.model.norm  # shared, frozen
        self.adapter = nn.Sequential(nn.Linear(2 * h, h), ResidualAdapter(h, config.adapter_width))
        self.adapter.to(head.device, head.dtype)
        self.register_buffer("vocab_subset", vocab_subset.to(head.device))  # [N]
        codes, d, m, dense = quantize_rows(head.detach()[self.vocab_subset.cpu()])
        self._blocks = (codes, d, m)
        self.head = nn.Linear(h, vocab_subset.numel(), bias=True).to(head.device, head.dtype)
        with torch.no_grad():
            self.head.weight.copy_(dense)  # [N, H]: the 4-bit rows, as the kernel computes them
            self.head.bias.zero_()  # the trained logit bias over S
        self.head.weight.requires_grad_(False)
        self._target = (target,)  # not a submodule: the target's parameters are not the draft's
        self._target_head = target.get_output_embeddings()
        self._head4 = None  # the 4-bit kernel's head (CPU float32 inference), built on first use

    # --- HF-style accessors used by models.loading and the engine ---------------------------------------
    def get_output_embeddings(self) -> nn.Module:
        """The target's full LM head: the vocabulary the draft's logits are indexed by."""
        return self._target_head

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.head.weight.dtype

    # --- the draft step ---------------------------------------------------------------------------------
    def _subset_head(self, f: torch.Tensor) -> torch.Tensor:
        """Logits over S [..., N] of features [..., H]: the 4-bit kernel on CPU float32 at inference, else the
        dense weight it stands for."""
        if torch.is_grad_enabled() or self.device.type != "cpu" or self.dtype != torch.float32:
            return self.head(f)
        if self._head4 is None:
            from models.gguf_blocks import QuantizedMatrix
            from models.int4 import Int4Linear

            self._head4 = Int4Linear(QuantizedMatrix("Q4_1", *self._blocks))
        return self._head4(f) + self.head.bias

    def head_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Subset logits [..., N] from the records' input ``[h_prev, e(x)]`` [..., 2H] (the distillation's call)."""
        return self._subset_head(self.final_norm(self.adapter(x.to(self.dtype))))

    def step(self, h_prev: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step for ``n`` nodes: the feature before each node ``h_prev`` [n, H] and its token ids [n] ->
        ``(logits over the full vocabulary [n, V] (-inf outside S), the nodes' features [n, H])``."""
        x = torch.cat([h_prev.to(self.device, self.dtype), self.embed_tokens(tokens.to(self.device))], dim=-1)
        f = self.final_norm(self.adapter(x))  # [n, H]
        return self.full_logits(self._subset_head(f)), f

    def full_logits(self, z: torch.Tensor) -> torch.Tensor:
        """Subset logits [..., N] spread over the full vocabulary [..., V], -inf outside S."""
        logits = z.new_full((*z.shape[:-1], self.config_draft.vocab_size), float("-inf"))
        logits[..., self.vocab_subset] = z
        return logits

    def forward(self, input_ids, attention_mask=None, use_cache=False, **_ignored) -> _Output:
        """Teacher forcing over whole sequences (no cache): q at every position of ``input_ids`` [B, n] from the
        target's features of the same ids (position 0 has no predecessor and reads a zero feature)."""
        if use_cache:
            raise SelfDraftError("the EAGLE draft keeps no cache: the decoder calls its `step` "
                                 "(engine), sequences go through forward(use_cache=False)")
        return _Output(self.unrolled_logits(input_ids, 1, attention_mask)[0], None)

    def unrolled_logits(self, input_ids: torch.Tensor, depth: int, attention_mask=None) -> list[torch.Tensor]:
        """q by draft depth, as a chain drafts it: element ``j - 1`` ([B, n, V]) holds, at position t, the draft
        at depth j of a chain whose first token was drafted j - 1 positions earlier from the target's feature;
        below that token it read its own features (the decoder's `step`), with the sequence's tokens as the
        drafted ones. Depth 1 is teacher forcing (`forward`). Positions with no predecessor read a zero feature."""
        target = self._target[0]
        feats = target.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        emb = self.embed_tokens(input_ids).to(self.dtype)  # [B, n, H]
        out, f = [], feats.to(self.dtype)
        for _ in range(depth):
            h_prev = torch.cat([torch.zeros_like(f[:, :1]), f[:, :-1]], dim=1)  # [B, n, H]: one position back
            f = self.final_norm(self.adapter(torch.cat([h_prev, emb], dim=-1)))
            out.append(self.full_logits(self._subset_head(f)))
        return out

    # --- artifact -----------------------------------------------------------------------------------------
    def trained_state(self) -> dict[str, torch.Tensor]:
        """What the artifact stores: fc and adapter weights, logit bias, subset ids (not the target's weights)."""
        state = {f"adapter.{k}": v.detach().cpu().contiguous() for k, v in self.adapter.state_dict().items()}
        state["logit_bias"] = self.head.bias.detach().cpu().contiguous()
        state["vocab_subset"] = self.vocab_subset.cpu().contiguous()
        return state


def load_eagle_draft(target: nn.Module, folder: str | Path) -> EagleDraft:
    """The EAGLE draft stored in ``folder`` for ``target`` (fingerprint-checked), ready for inference
    (`for_inference`)."""
    from safetensors.torch import load_file

    from models.self_draft import WEIGHTS_FILE, check_fingerprint, read_raw_config

    folder = Path(folder)
    raw = read_raw_config(folder, FORMAT_VERSION)
    if raw.get("kind") != KIND:
        raise SelfDraftError(f"{folder} holds a {raw.get('kind', 'self_draft')} artifact, not an EAGLE draft; "
                             f"load it as {raw.get('kind', 'self_draft')}:{folder}")
    config = EagleDraftConfig(**{k: raw[k] for k in EagleDraftConfig.__dataclass_fields__ if k in raw})
    check_fingerprint(config.target_fingerprint, target, f"EAGLE draft artifact {folder}")
    state = load_file(str(folder / WEIGHTS_FILE))
    draft = EagleDraft(target, config, vocab_subset=state["vocab_subset"])
    adapter = {k.removeprefix("adapter."): v for k, v in state.items() if k.startswith("adapter.")}
    try:
        draft.adapter.load_state_dict(adapter)
    except RuntimeError as e:
        raise SelfDraftError(f"{folder}: adapter weights do not match its config: {e}") from None
    with torch.no_grad():
        draft.head.bias.copy_(state["logit_bias"])
    return for_inference(draft)


def for_inference(draft: EagleDraft) -> EagleDraft:
    """``draft`` in eval mode, fc and the adapter on Q8_0 blocks of their weights at CPU float32 inference
    (`models.int4.Q8Linear`: a quarter of the bytes, TEST acceptance unchanged, docs/draft.md); a layer whose input
    is not whole blocks of 32 (tiny test models) prepacked for oneDNN instead (`models.fast_path`)."""
    from models.fast_path import pack_linears
    from models.int4 import use_q8_linears

    use_q8_linears(draft.adapter.eval())
    pack_linears(draft.adapter)
    return draft.eval()
