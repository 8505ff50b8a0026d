"""``branchpoint chain-selector``: stage chain_selector, a selector of one chain's draft length, exported.

A runtime that verifies a single chain by speculative sampling (HF transformers' assisted generation,
`integrations.transformers`) can use only part of the tree selector's policy: how many tokens to draft at this
step, 0 for a plain step. This stage trains that selector from the labels stage collect already has (no new
collection): ``chain_selector.method``'s Ê of the grid's chains (``K = 1``; on a chain every OT verifier is
standard speculative sampling, so these are ``naive``'s labels), one output per draft length n, as the action
``(1, n, 0)`` (`selector.data.chain_labels`). Training is stage train's (`pipeline.train.train_one`: the
``train.*`` hyperparameters, feature set ``target_only``: the target-side inputs a runtime has without running
the draft); export is stage export's (`pipeline.export.export_one`: ONNX + the same sidecar, with ``"kind":
"chain"``, parity-checked, logged to MLflow and registered as ``chain_selector.registered_model``).

Reads: ``collect.out``, ``profile.out``. Writes: ``chain_selector.train_out``, ``chain_selector.out``,
``chain_selector.metrics``.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

SECTIONS = ("model", "tracking", "profile", "collect", "train", "export", "chain_selector")  # the sections it loads

FEATURE_SET = "target_only"  # what a runtime computes without the draft (integrations/transformers.py)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress", action="store_true", help="show Lightning's progress bar")
    parser.add_argument("--no-mlflow", action="store_true", help="skip MLflow logging and registration of the export")


def chain_config(cfg):
    """``cfg`` with train and export pointed at the chain selector's method, folders and registered model."""
    cc = cfg.chain_selector
    train = dataclasses.replace(cfg.train, method=cc.method, feature_set=FEATURE_SET, out=cc.train_out,
                                metrics=cc.metrics)
    export = dataclasses.replace(cfg.export, out=cc.out, registered_model=cc.registered_model)
    return cfg.replace(train=train, export=export)


def run(cfg, args) -> int:
    from pipeline.export import export_one
    from pipeline.train import train_one

    sub = chain_config(cfg)
    run_name = f"chain/{sub.train.method}/{FEATURE_SET}/{sub.train.objective}"
    rc = train_one(sub, argparse.Namespace(progress=args.progress, run_name=run_name), chain=True)
    if rc:
        return rc
    return export_one(sub, argparse.Namespace(no_mlflow=args.no_mlflow), Path(sub.train.out), Path(sub.export.out))
