"""Training the selector (`selector.network.SelectorNet`) with Lightning: two objectives, one decision rule.

Both objectives train the same network (one output per (method, action) of the `OutputLayout`) and are
judged by the same decision, ``argmax_o Ê_pred(c, o) / T(c, o)`` with the shared latency model
(`decoding.pricing.decide`), so a selector moved to another machine adapts by re-profiling T.

``regression`` (this project's selector): mean squared error between the output and the label
Ê(c, o), over the outputs with a label. Why MSE: Ê is itself an unbiased, noisy estimate of the
expected block efficiency (s union trees; drafting variance remains), and the decision needs the
conditional mean E[Ê | features] for every output (expected tokens per step over expected seconds per
step), which is exactly what squared error targets; absolute or Huber losses target a median or
something between, biased for the skewed labels of large trees. Errors are in tokens per step, the
scale on which the decision compares outputs. ``label_weighting: inverse_se`` weights each term by
``1 / (se^2 + floor^2)`` (se: the label's standard error over the union trees), which down-weights
noisy labels; it is off by default because with s = 4 trees se is estimated from the same draws as
the label and correlates with it (high labels come with high se), which biases the fit downwards.

``throughput`` (the paper's policy loss, ALGORITHMS.md section 6): the policy
``pi(o|c) = softmax_o(beta * log(Ê_pred(c, o) / T(c, o)))`` (beta a learned inverse temperature; the
decision is its argmax, so the deployed rule is unchanged), ``TPS_pi(c) = sum pi Ê / sum pi T`` and

    loss = mean(-log(TPS_pi / TPS_base)) + lambda * mean over the worst alpha fraction of
           (max(1 - TPS_pi / TPS_base, 0))^2

with TPS_base(c) = Ê / T of the best static output of c's sampling setting (chosen on train). Its
outputs are decision scores, not calibrated Ê (their MAE is reported all the same). ``Ê_pred`` enters
as ``softplus_20(output)`` (= the output above ~0.25, always positive, never a dead gradient).

Validation (each epoch, on all VAL roots at once so every DDP rank logs the same numbers):
`selector.report.selector_report` -> ``val/tps/selector``, ``val/selector_vs_best_static``, ``val/regret``,
``val/mae``, ``val/spearman``, ... and the same per sampling setting / source / method.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

from .data import SelectorData, SelectorDataModule
from .network import SelectorNet
from .report import flat_metrics, selector_report

OBJECTIVES = ("regression", "throughput")
LABEL_WEIGHTINGS = ("none", "inverse_se")


@dataclass
class SelectorHParams:
    """The optimisation knobs; their defaults live in the config (`pipeline.sections.TrainConfig`, handed over by
    `pipeline.training_data.hparams`)."""

    objective: str  # regression | throughput (module docstring)
    lr: float  # peak AdamW learning rate (cosine decay to lr / 20 over the epochs)
    weight_decay: float
    epochs: int
    label_weighting: str  # none | inverse_se (regression only)
    throughput_lambda: float  # weight of the worst-alpha hinge term
    throughput_alpha: float  # fraction of worst roots in the hinge term
    se_floor: float = 0.05  # floor of the label standard error in inverse_se weights
    policy_beta: float = 20.0  # initial inverse temperature of the throughput policy
    seed: int = 0  # of the initialisation, the shuffles and dropout (`pl.seed_everything`)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, not {self.objective!r}")
        if self.label_weighting not in LABEL_WEIGHTINGS:
            raise ValueError(f"label_weighting must be one of {LABEL_WEIGHTINGS}, not {self.label_weighting!r}")
        if not 0 < self.throughput_alpha <= 1:
            raise ValueError(f"throughput_alpha must be in (0, 1], not {self.throughput_alpha}")


def regression_loss(pred, E, se, valid, weighting: str = "none", se_floor: float = 0.05) -> torch.Tensor:
    """Mean (weighted) squared error over the outputs with a finite label. Shapes ``[B, O]``, valid ``[O]``."""
    mask = torch.isfinite(E) & valid
    err = torch.where(mask, pred - torch.nan_to_num(E), torch.zeros_like(pred)) ** 2
    if weighting == "inverse_se":
        w = torch.where(mask, 1.0 / (se.clamp_min(0) ** 2 + se_floor ** 2), torch.zeros_like(pred))
        return (w * err).sum() / w.sum().clamp_min(1e-12)
    return err.sum() / mask.sum().clamp_min(1)


def softmax_policy(pred, E, cost, valid, beta) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pi, mask)``: the policy ``softmax(beta * log(softplus_20(pred) / cost))`` over the outputs with a finite
    label (``mask``), both ``[B, O]``."""
    mask = torch.isfinite(E) & valid
    logits = beta * (torch.log(F.softplus(pred, beta=20.0)) - torch.log(cost))
    return torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1), mask


def policy_tps(pred, E, cost, valid, beta) -> torch.Tensor:
    """``[B]`` TPS_pi(c) of the `softmax_policy`."""
    pi, _ = softmax_policy(pred, E, cost, valid, beta)
    return (pi * torch.nan_to_num(E)).sum(-1) / (pi * cost).sum(-1)


def throughput_loss(ratio: torch.Tensor, lam: float, alpha: float) -> torch.Tensor:
    """The paper's policy loss (module docstring) of ``ratio`` ``[B]`` = TPS_pi(c) / TPS_base(c) (`policy_tps`)."""
    hinge = F.relu(1.0 - ratio) ** 2
    k = max(1, math.ceil(alpha * ratio.shape[0]))
    return (-torch.log(ratio)).mean() + lam * torch.topk(hinge, k).values.mean()


@torch.no_grad()
def predict(net: SelectorNet, data: SelectorData, batch_size: int = 8192) -> np.ndarray:
    """``[N, O]`` the network's outputs on every root of ``data`` (eval mode, float64 numpy)."""
    was_training = net.training
    net.eval()
    device = next(net.parameters()).device
    names = list(data.schema.input_shapes())
    if tuple(names) != tuple(net.input_names):
        raise ValueError(f"the net takes inputs {net.input_names}, the data's schema gives {names}")
    out = []
    for start in range(0, len(data), batch_size):
        xs = [torch.as_tensor(data.inputs[k][start:start + batch_size], dtype=torch.float32, device=device)
              for k in names]
        out.append(net(*xs).double().cpu().numpy())
    net.train(was_training)
    return np.concatenate(out) if out else np.zeros((0, net.num_outputs))


class SelectorModule(pl.LightningModule):
    """The LightningModule: loss by objective, AdamW + cosine, validation by realized throughput."""

    def __init__(self, net: SelectorNet, hparams: SelectorHParams, fit: SelectorData, val: SelectorData,
                 valid: np.ndarray) -> None:
        super().__init__()
        self.net, self.hp = net, hparams
        self.hparams.update(vars(hparams))  # saved in checkpoints; MLflow params are logged once by the stage
        self.fit_data, self.val_data = fit, val
        self.register_buffer("valid", torch.as_tensor(np.asarray(valid, bool)), persistent=False)  # [O]
        log_beta = torch.tensor(math.log(hparams.policy_beta))
        if hparams.objective == "throughput":  # a parameter only where the loss uses it (DDP needs all)
            self.log_beta = torch.nn.Parameter(log_beta)
        else:
            self.register_buffer("log_beta", log_beta)
        self.last_report: dict | None = None

    def loss(self, batch) -> torch.Tensor:
        *inputs, E, se, cost, base = batch
        pred = self.net(*inputs)
        if self.hp.objective == "regression":
            return regression_loss(pred, E, se, self.valid, self.hp.label_weighting, self.hp.se_floor)
        ratio = policy_tps(pred, E, cost, self.valid, self.log_beta.exp()) / base
        return throughput_loss(ratio, self.hp.throughput_lambda, self.hp.throughput_alpha)

    def training_step(self, batch, _idx):
        loss = self.loss(batch)
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=batch[0].shape[0])
        return loss

    def validation_step(self, batch, _idx):
        self.log("val/loss", self.loss(batch), batch_size=batch[0].shape[0], sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        report = selector_report(predict(self.net, self.val_data), self.val_data, self.fit_data,
                                 self.valid.cpu().numpy())
        self.last_report = report
        for name, value in flat_metrics(report, "val").items():
            self.log(name, value, prog_bar=name in ("val/selector_vs_best_static", "val/mae"))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hp.lr, weight_decay=self.hp.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, self.hp.epochs),
                                                           eta_min=self.hp.lr / 20)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}


def init_output_bias(net: SelectorNet, labels: np.ndarray, valid: np.ndarray) -> None:
    """Start every output at its train mean label (1 for outputs without labels)."""
    mean = np.where(valid, np.nanmean(np.where(np.isfinite(labels), labels, np.nan), axis=0), 1.0)
    with torch.no_grad():
        net.mlp[-1].bias.copy_(torch.as_tensor(np.nan_to_num(mean, nan=1.0), dtype=torch.float32))


@dataclass
class FitSetup:
    """Where and how Lightning runs a fit: the MLflow logger (None: no logging), the best-epoch checkpoint folder
    (None: keep the last epoch), the accelerator / devices / strategy of `pl.Trainer` and the progress bar."""

    logger: object = None
    checkpoint_dir: str | None = None
    accelerator: str = "cpu"
    devices: int | str = "auto"
    strategy: str = "auto"
    progress: bool = False


def fit_selector(net: SelectorNet, dm: SelectorDataModule, hp: SelectorHParams,
                 setup: FitSetup | None = None) -> tuple[SelectorModule, str]:
    """Standardize on train, train ``net`` in place, restore the best epoch (by ``val/tps/selector``).

    ``dm.batch_size`` is the batch of one optimizer step over all devices: with ``devices`` > 1 (DDP, e.g.
    ``strategy="ddp"``; gloo on CPU) each process takes ``batch_size / world_size`` rows of it and the gradients
    are averaged, so the run takes the steps one device would.

    Returns the module (its ``last_report`` is the validation report of the restored epoch) and the best
    checkpoint's path ("" without ``setup.checkpoint_dir``)."""
    setup = setup or FitSetup()
    pl.seed_everything(hp.seed, workers=True, verbose=False)
    net.set_standardization({k: (torch.as_tensor(m), torch.as_tensor(s)) for k, (m, s) in dm.standardization().items()})
    fit, val = dm.data.subset(dm.train_idx), dm.data.subset(dm.val_idx)
    valid = fit.valid_outputs()
    init_output_bias(net, fit.labels, valid)
    module = SelectorModule(net, hp, fit, val, valid)
    callbacks = []
    ckpt = None
    if setup.checkpoint_dir:
        from pytorch_lightning.callbacks import ModelCheckpoint

        ckpt = ModelCheckpoint(dirpath=setup.checkpoint_dir, filename="best", monitor="val/tps/selector", mode="max",
                               save_top_k=1, save_last=False, enable_version_counter=False)
        callbacks.append(ckpt)
    trainer = pl.Trainer(max_epochs=hp.epochs, accelerator=setup.accelerator, devices=setup.devices,
                         strategy=setup.strategy, logger=setup.logger if setup.logger is not None else False,
                         callbacks=callbacks, enable_checkpointing=ckpt is not None, enable_progress_bar=setup.progress,
                         enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=1,
                         deterministic=False)
    batch = dm.batch_size
    dm.batch_size = -(-batch // trainer.world_size)  # a global batch: each DDP process takes its share of a step
    try:
        trainer.fit(module, datamodule=dm)
    finally:
        dm.batch_size = batch
    best = ckpt.best_model_path if ckpt is not None else ""
    if best:
        state = torch.load(best, map_location="cpu", weights_only=True)["state_dict"]
        module.load_state_dict(state)
    net.cpu().eval()
    module.last_report = selector_report(predict(net, val), val, fit, valid)  # the restored (best) epoch
    return module, best
