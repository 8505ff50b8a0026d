"""Distilling the self-draft (models/self_draft.py) from its target with Lightning.

Data: distillation records (models/draft_data.py) from target-sampled trajectories of the DRAFT prompts:
the target's hidden state after layer k and its top-K next-token log-probabilities at T = 1. The shared
layers are frozen, so their output is computed once (one teacher-forced forward per trajectory) and
training only runs the adapter, the final norm and the subset head: thousands of steps fit in minutes
on a CPU.

Loss per position, with p the target's top-K probabilities and q the draft's distribution over its
vocabulary subset S (ids of the top-K outside S are skipped: q is 0 there, nothing can be learned):
- ``kl``: forward KL(p || q) restricted to the top-K (mass-covering; its gradient equals the
  cross-entropy's), logged as ``train/kl``;
- plus ``tv_weight * (1 - sum_x min(p, q))`` over the top-K: the rejection probability of one drafted
  token, the quantity speculative decoding pays for (a lower bound of acceptance, logged as
  ``train/acceptance_T1.0``).

Training-time test (``unroll`` > 1, the EAGLE head only; HASS, Zhang et al. 2025, and EAGLE-3 train this way):
below the first drafted token the head reads its own feature, not the target's, so a training example is a
run of ``unroll`` consecutive positions of one continuation. Depth 1 reads the record's input ``[h_{t-1}, e(x_t)]``;
depth d reads ``[f_{d-1}, e(x_{t+d-1})]``, the head's own feature one step up (gradients flow through it) and the
embedding half of the next record; each depth is scored against its own position's top-K. The loss weighs depth d
by ``unroll_decay ** (d - 1)`` (a deeper token only counts when the ones above it were accepted), normalized to sum
to 1, so ``unroll = 1`` is the loss above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytorch_lightning as pl
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

from models.self_draft import SelfDraft


@dataclass(frozen=True)
class DistillHParams:
    """The optimisation knobs. No defaults: stage train_draft builds this view from its config
    (``pipeline/config.py`` TrainDraftConfig, same field names, the one place defaults live)."""

    lr: float  # peak AdamW learning rate
    weight_decay: float
    warmup_steps: int  # linear warmup, then cosine decay to `min_lr_ratio * lr`
    steps: int  # optimizer steps in all
    min_lr_ratio: float
    tv_weight: float  # weight of the (1 - acceptance) term next to the KL
    negatives: int  # sampled-softmax negatives per training step (0 = exact softmax over S)
    val_every: int  # optimizer steps between validations
    seed: int
    unroll: int  # draft depths per training example (1 = teacher forcing only; > 1: the EAGLE head only)
    unroll_decay: float  # weight of depth d in the loss: unroll_decay ** (d - 1)


def rank_vocabulary(top_ids: torch.Tensor, top_logp: torch.Tensor, vocab_size: int, size: int,
                    always: list[int] = ()) -> torch.Tensor:
    """FR-Spec subset: the ``size`` ids with the largest total target probability over the records.

    ``top_ids``/``top_logp``: [N, K]. Ids in ``always`` (e.g. EOS) are kept whatever their rank. Returns
    sorted ids [size].
    """
    size = min(size or vocab_size, vocab_size)
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    mass.index_add_(0, top_ids.reshape(-1), top_logp.exp().reshape(-1).double())
    mass[torch.tensor(list(always), dtype=torch.long)] = float("inf")
    ranked = torch.argsort(mass, descending=True, stable=True)  # ties (unseen ids) keep id order
    return torch.sort(ranked[:size]).values


class RecordDataset(Dataset):
    """Distillation records indexed by a list of positions (one whole batch per `__getitem__`).

    With ``unroll`` > 1 (``record_seq`` then required, the EAGLE head's records of width 2H) an index is a run of
    ``unroll`` consecutive records of one continuation, and a batch is ``(input [b, 2H], the embedding half of
    the run's next records [b, unroll - 1, H], top_ids [b, unroll, K], top_logp [b, unroll, K])``."""

    def __init__(self, hidden: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor,
                 record_seq: torch.Tensor | None = None, unroll: int = 1):
        self.hidden, self.top_ids, self.top_logp, self.unroll = hidden, top_ids, top_logp, unroll
        if unroll < 1:
            raise ValueError(f"unroll must be >= 1, got {unroll}")
        if unroll == 1:
            self.starts = None
            return
        if record_seq is None:
            raise ValueError("unrolled records need record_seq (which continuation each record belongs to)")
        n = int(hidden.shape[0])
        ends = torch.arange(n - unroll + 1)
        self.starts = ends[record_seq[ends] == record_seq[ends + unroll - 1]]  # runs inside one continuation

    def __len__(self) -> int:
        return int(self.hidden.shape[0]) if self.starts is None else int(self.starts.numel())

    def __getitem__(self, rows):
        rows = torch.as_tensor(rows)
        if self.starts is None:
            return self.hidden[rows].float(), self.top_ids[rows], self.top_logp[rows]
        run = self.starts[rows][:, None] + torch.arange(self.unroll)  # [b, unroll]
        h = self.hidden.shape[1] // 2
        return (self.hidden[run[:, 0]].float(), self.hidden[run[:, 1:], h:].float(),
                self.top_ids[run], self.top_logp[run])


class DistillDataModule(pl.LightningDataModule):
    def __init__(self, train: RecordDataset, val: RecordDataset, batch_size: int = 256, seed: int = 0):
        super().__init__()
        self.train_set, self.val_set, self.batch_size, self.seed = train, val, batch_size, seed

    def train_dataloader(self) -> DataLoader:
        gen = torch.Generator().manual_seed(self.seed)
        sampler = BatchSampler(RandomSampler(self.train_set, generator=gen), self.batch_size, drop_last=True)
        return DataLoader(self.train_set, sampler=sampler, batch_size=None)

    def val_dataloader(self) -> DataLoader:
        sampler = BatchSampler(SequentialSampler(self.val_set), 1024, drop_last=False)
        return DataLoader(self.val_set, sampler=sampler, batch_size=None)


def distill_terms(draft: SelfDraft, pos_in_subset: torch.Tensor, hidden, top_ids, top_logp, negatives: int = 0):
    """Per-batch means of (KL(p||q) over the top-K in S, acceptance lower bound at T = 1) of the draft's input
    ``hidden`` [b, D]; `feature_terms` of its feature."""
    f = draft.final_norm(draft.adapter(hidden.to(draft.dtype)))  # records hold float16 rows, read as float32
    return feature_terms(draft, pos_in_subset, f, top_ids, top_logp, negatives)


def unrolled_terms(draft, pos_in_subset: torch.Tensor, batch: tuple,
                   negatives: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`distill_terms` at each depth of a training-time test (module docstring). ``batch``: a `RecordDataset` batch
    of unrolled records, ``(hidden [b, 2H], next_embeds [b, D - 1, H], top_ids [b, D, K], top_logp [b, D, K])``
    -> D pairs (kl, acceptance)."""
    hidden, next_embeds, top_ids, top_logp = batch
    f = draft.final_norm(draft.adapter(hidden.to(draft.dtype)))
    terms = [feature_terms(draft, pos_in_subset, f, top_ids[:, 0], top_logp[:, 0], negatives)]
    for d in range(1, top_ids.shape[1]):
        f = draft.final_norm(draft.adapter(torch.cat([f, next_embeds[:, d - 1].to(draft.dtype)], dim=-1)))
        terms.append(feature_terms(draft, pos_in_subset, f, top_ids[:, d], top_logp[:, d], negatives))
    return terms


def feature_terms(draft, pos_in_subset: torch.Tensor, f, top_ids, top_logp, negatives: int = 0):
    """Per-batch means of (KL(p||q) over the top-K in S, acceptance lower bound at T = 1), q = softmax of the
    head over S at the draft's features ``f`` [b, H].

    ``negatives = 0``: q normalized exactly over S. ``negatives = r > 0`` (training speed-up, sampled
    softmax): logits are computed only for the *candidates* U (the batch's top-K ids in S) and r ids drawn
    uniformly from S \\ U, whose exp-logits are scaled by ``|S \\ U| / r`` in the normalizer (an unbiased
    estimate of its tail).
    """
    pos = pos_in_subset[top_ids]  # [b, K], index in S or -1 outside S
    valid = pos >= 0
    n_subset = draft.vocab_subset.numel()
    if negatives <= 0 or negatives >= n_subset:
        logq = torch.log_softmax(draft.head(f).float(), dim=-1)  # [b, N]
        logq_top = logq.gather(1, pos.clamp_min(0))  # [b, K]
    else:
        cand, inverse = torch.unique(pos[valid], return_inverse=True)  # [U]; index of each valid entry in cand
        outside = torch.ones(n_subset, dtype=torch.bool, device=pos.device)
        outside[cand] = False
        rest = outside.nonzero()[:, 0]  # [N - U]
        r = min(negatives, rest.numel())
        neg = rest[torch.randperm(rest.numel(), device=pos.device)[:r]]  # [r]
        rows = torch.cat([cand, neg])
        z = (f @ draft.head.weight[rows].T + draft.head.bias[rows]).float()  # [b, U + r]
        if r > 0:
            z = torch.cat([z[:, : cand.numel()], z[:, cand.numel():] + math.log(rest.numel() / r)], dim=1)
        log_z = torch.logsumexp(z, dim=-1, keepdim=True)  # [b, 1]
        col = torch.zeros_like(pos)
        col[valid] = inverse
        logq_top = z[:, : cand.numel()].gather(1, col) - log_z  # [b, K]
    p = top_logp.exp()  # [b, K]
    kl = torch.where(valid, p * (top_logp - logq_top), 0.0).sum(1).mean()
    acc = torch.where(valid, torch.minimum(p, logq_top.exp()), 0.0).sum(1).mean()
    return kl, acc


class DraftDistillation(pl.LightningModule):
    """Trains ``draft.adapter`` and the head's logit bias; everything else in the draft stays frozen."""

    def __init__(self, draft: SelfDraft, hparams: DistillHParams):
        super().__init__()
        self.draft = draft
        self.hp = hparams
        self.save_hyperparameters(vars(hparams), logger=False)
        pos = torch.full((draft.config_draft.vocab_size,), -1, dtype=torch.long)
        pos[draft.vocab_subset.cpu()] = torch.arange(draft.vocab_subset.numel())
        self.register_buffer("pos_in_subset", pos, persistent=False)  # [V] -> index in S, or -1
        for p in self.draft.parameters():
            p.requires_grad_(False)
        for p in self.trainable_parameters():
            p.requires_grad_(True)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.draft.adapter.parameters()) + [self.draft.head.bias]

    def _terms(self, batch, negatives: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(kl, acceptance) per draft depth of a batch (one depth unless the records are unrolled)."""
        if len(batch) == 3:
            return [distill_terms(self.draft, self.pos_in_subset, *batch, negatives=negatives)]
        return unrolled_terms(self.draft, self.pos_in_subset, batch, negatives=negatives)

    def _log_terms(self, split: str, terms, **kw) -> None:
        kl, acc = terms[0]
        logged = {f"{split}/kl": kl, f"{split}/acceptance_T1.0": acc}
        logged.update({f"{split}/acceptance_T1.0_depth{d + 1}": a for d, (_, a) in enumerate(terms) if d})
        self.log_dict(logged, prog_bar=True, **kw)

    def training_step(self, batch, _idx):
        terms = self._terms(batch, self.hp.negatives)
        self._log_terms("train", terms)
        weights = [self.hp.unroll_decay ** d for d in range(len(terms))]
        loss = sum(w * (kl + self.hp.tv_weight * (1.0 - acc)) for w, (kl, acc) in zip(weights, terms, strict=True))
        return loss / sum(weights)

    def validation_step(self, batch, _idx):
        self._log_terms("val", self._terms(batch, 0), batch_size=batch[0].shape[0])

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.trainable_parameters(), lr=self.hp.lr, weight_decay=self.hp.weight_decay)
        hp = self.hp

        def factor(step: int) -> float:
            if step < hp.warmup_steps:
                return (step + 1) / hp.warmup_steps
            t = min(1.0, (step - hp.warmup_steps) / max(1, hp.steps - hp.warmup_steps))
            return hp.min_lr_ratio + (1 - hp.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def fit_draft(draft: SelfDraft, data: DistillDataModule, hparams: DistillHParams, logger=None,
              progress: bool = False) -> DraftDistillation:
    """Train in place (CPU or the draft's device); returns the LightningModule (metrics in its trainer)."""
    pl.seed_everything(hparams.seed, workers=True, verbose=False)
    module = DraftDistillation(draft, hparams)
    trainer = pl.Trainer(
        max_steps=hparams.steps,
        accelerator="gpu" if draft.device.type == "cuda" else "cpu",
        devices=1,
        logger=logger if logger is not None else False,
        enable_checkpointing=False,
        enable_progress_bar=progress,
        enable_model_summary=False,
        val_check_interval=min(hparams.val_every, hparams.steps),  # in optimizer steps (across epochs)
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=50,
        deterministic=False,
    )
    trainer.fit(module, datamodule=data)
    draft.eval()
    return module
