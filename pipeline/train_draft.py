"""``branchpoint train-draft``: stage train_draft, the self-speculative draft of the target.

Reads: params ``model.*``, ``prompts.*``, ``train_draft.*``. Writes: the artifact folder
``train_draft.out`` (adapter.safetensors + config.json; loaded as the draft spec ``self_draft:<out>``)
and ``train_draft.metrics`` (metrics/draft.json). Steps:

1. sample target continuations of the TRAIN prompts (and VAL prompts, for validation) with the
   distillation records (cached under ``model.cache_dir``/draft_data, keyed by their inputs);
2. rank the vocabulary subset, then distill the adapter with Lightning, logging to MLflow;
3. save the artifact, reload it through `load_self_draft` (the path the decoder uses) and evaluate it on
   the TEST prompts: token acceptance at each ``eval_temperatures`` and the draft/target step time.

``--evaluate-only`` runs step 3 on the existing artifact (anyone can re-measure the metrics).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--evaluate-only", action="store_true",
                        help="measure the existing artifact on the TEST prompts and write the metrics file")
    parser.add_argument("--progress", action="store_true", help="show Lightning's progress bar")


def _splits(cfg, tokenizer) -> dict:
    """The train/val/test prompt Datasets, with the chat-formatted text in column ``formatted``."""
    from data_collection.prompts import format_prompts, load_prompt_set, split_prompts

    prompts = load_prompt_set(cfg.prompts.sets, max_prompts=cfg.prompts.max_prompts)
    splits = split_prompts(prompts, tuple(cfg.prompts.split), seed=cfg.prompts.seed)
    return {name: format_prompts(ds, tokenizer, use_chat_template=cfg.prompts.chat_template)
            for name, ds in splits.items()}


def _formatted(splits: dict) -> dict[str, list[str]]:
    return {name: list(ds["formatted"]) for name, ds in splits.items()}


def _texts(cfg, tokenizer) -> dict[str, list[str]]:
    """The chat-formatted prompt texts of each split."""
    return _formatted(_splits(cfg, tokenizer))


def _records(cfg, target, tokenizer, texts: list[str], seed: int, split: str):
    """Distillation records of ``texts``, ``samples_per_prompt`` continuations each, concatenated."""
    import torch

    from models.draft_data import cached_continuations

    td = cfg.train_draft
    parts = [
        cached_continuations(
            Path(cfg.model.cache_dir) / "draft_data", target, tokenizer, texts,
            max_new_tokens=td.max_new_tokens, temperature=td.gen_temperature, batch_size=td.gen_batch_size,
            seed=seed + i, capture_layer=td.layers, top_k=td.top_k,
            progress=f"sampling {split.upper()} continuations {i + 1}/{td.samples_per_prompt}",
        )
        for i in range(td.samples_per_prompt)
    ]
    return [torch.cat([getattr(p, name) for p in parts]) for name in ("hidden", "top_ids", "top_logp")]


def _logger(td, run_name: str):
    from pytorch_lightning.loggers import MLFlowLogger

    return MLFlowLogger(experiment_name=td.experiment, tracking_uri=td.tracking_uri, run_name=run_name)


def train(cfg, target, tokenizer, texts, progress: bool = False) -> dict:
    """Steps 1-2 and the artifact; returns training facts for the metrics file."""
    from models.draft_data import eos_ids
    from models.draft_training import (
        DistillDataModule,
        DistillHParams,
        RecordDataset,
        fit_draft,
        rank_vocabulary,
    )
    from models.self_draft import SelfDraft, SelfDraftConfig, save_self_draft, target_fingerprint

    td = cfg.train_draft
    start = time.perf_counter()
    train_rec = _records(cfg, target, tokenizer, texts["train"], td.seed, "train")
    val_rec = _records(cfg, target, tokenizer, texts["val"], td.seed + 1, "val")
    gen_seconds = time.perf_counter() - start
    vocab = target.get_output_embeddings().weight.shape[0]
    subset = rank_vocabulary(train_rec[1], train_rec[2], vocab, td.vocab_subset_size,
                             always=sorted(eos_ids(tokenizer, target)))
    config = SelfDraftConfig(layers=td.layers, adapter_width=td.adapter_width,
                             vocab_subset_size=int(subset.numel()), int8=td.int8,
                             target_fingerprint=target_fingerprint(target))
    draft = SelfDraft(target, config, vocab_subset=subset)
    hparams = DistillHParams(lr=td.lr, warmup_steps=td.warmup_steps, max_steps=td.steps, tv_weight=td.tv_weight)
    logger = _logger(td, "train_draft")
    logger.log_hyperparams({  # the one explicit hyperparameter log
        **{f"train_draft.{k}": v for k, v in vars(td).items()},
        "model.target": cfg.model.target, "prompts.sets": json.dumps(cfg.prompts.sets),
        "prompts.split": json.dumps(cfg.prompts.split), "prompts.seed": cfg.prompts.seed,
        "train_records": int(train_rec[0].shape[0]), "val_records": int(val_rec[0].shape[0]),
    })
    data = DistillDataModule(RecordDataset(*train_rec), RecordDataset(*val_rec), td.batch_size, td.seed)
    start = time.perf_counter()
    fit_draft(draft, data, hparams, logger=logger, val_every=td.val_every, seed=td.seed, progress=progress)
    train_seconds = time.perf_counter() - start
    coverage = _subset_coverage(subset, *val_rec[1:])
    facts = {"train_seconds": train_seconds, "generation_seconds": gen_seconds,
             "train_records": int(train_rec[0].shape[0]), "val_records": int(val_rec[0].shape[0]),
             "vocab_subset_size": int(subset.numel()), "vocab_subset_val_mass": coverage,
             "mlflow_run_id": logger.run_id}
    save_self_draft(draft, td.out, extra=facts)
    return facts


def _subset_coverage(subset, top_ids, top_logp) -> float:
    """Mean target probability (T = 1, top-k) that falls inside the subset."""
    import torch

    inside = torch.isin(top_ids, subset)
    return float((top_logp.exp() * inside).sum(1).mean())


def evaluate(cfg, target, tokenizer, texts, sources: list[str]) -> dict:
    """Step 3: acceptance on TEST prompts at each temperature (overall, by prompt source and by target
    entropy), step-time ratio, expected chain efficiency."""
    import torch

    from data_collection.profile import step_times, tile_ids
    from models.draft_data import breakdown, cached_continuations, chain_block_efficiency, position_stats
    from models.loading import common_vocab_size
    from models.self_draft import load_self_draft

    td = cfg.train_draft
    draft = load_self_draft(target, td.out)
    metrics: dict = {"test_prompts": len(texts["test"])}
    for t in td.eval_temperatures:
        data = cached_continuations(Path(cfg.model.cache_dir) / "draft_data", target, tokenizer, texts["test"],
                                    max_new_tokens=td.eval_max_new_tokens, temperature=t,
                                    batch_size=td.gen_batch_size, seed=td.seed + 2,
                                    progress=f"sampling TEST continuations (T={t})")
        stats = position_stats(target, draft, data, [t])[t]
        acc = stats.acceptance
        flat = torch.cat(acc)
        metrics[f"acceptance_test_T{t}"] = float(flat.mean())
        metrics[f"test_positions_T{t}"] = int(flat.numel())
        metrics[f"breakdown_test_T{t}"] = breakdown(stats, sources)
        for n in (2, 4, 6):
            metrics[f"expected_chain_block_efficiency_L{n}_T{t}"] = chain_block_efficiency(acc, n)
    ids = tokenizer(texts["test"][0], add_special_tokens=False)["input_ids"]
    metrics.update(step_times(target, draft, tile_ids(ids, td.timing_context),
                              common_vocab_size(target, draft, tokenizer), reps=td.timing_reps))
    return metrics


def _mlflow_metrics(metrics: dict) -> dict[str, float]:
    """The TEST metrics as MLflow metric names (``test/...``), breakdowns flattened."""
    out = {}
    for key, value in metrics.items():
        if key.startswith(("acceptance_test_", "step_time_ratio", "expected_chain")):
            out["test/" + key.replace("acceptance_test_", "acceptance_")] = value
        elif key.startswith("breakdown_test_"):
            temp = key.removeprefix("breakdown_test_")
            for part, groups in value.items():
                for group, v in groups.items():
                    name = group.strip("[)").replace(", ", "-")
                    out[f"test/acceptance_{temp}/{part}/{name}"] = v["acceptance"]
    return out


def run(cfg, args) -> int:
    import torch

    from models.loading import load_model, load_tokenizer, resolve_device, resolve_dtype

    td = cfg.train_draft
    torch.set_num_threads(td.threads)
    torch.manual_seed(td.seed)
    device, dtype = resolve_device(cfg.model.device), resolve_dtype(cfg.model.dtype)
    tokenizer = load_tokenizer(cfg.model.target, cfg.model.cache_dir)
    target = load_model(cfg.model.target, device, dtype, cfg.model.cache_dir)
    for p in target.parameters():
        p.requires_grad_(False)
    splits = _splits(cfg, tokenizer)
    texts = _formatted(splits)
    facts = {}
    metrics_path = Path(td.metrics)
    if args.evaluate_only:
        from models.self_draft import CONFIG_FILE, read_artifact_config

        read_artifact_config(td.out)  # clear error when the artifact is missing
        facts = json.loads((Path(td.out) / CONFIG_FILE).read_text()).get("extra", {})
    else:
        start = time.perf_counter()
        facts = train(cfg, target, tokenizer, texts, progress=args.progress)
        print(f"trained in {time.perf_counter() - start:.0f} s (of which fit {facts['train_seconds']:.0f} s); "
              f"artifact: {td.out}/")
    metrics = {**evaluate(cfg, target, tokenizer, texts, list(splits["test"]["source"])), **facts}
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = metrics_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, metrics_path)
    if facts.get("mlflow_run_id"):
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=td.tracking_uri)
        for name, value in _mlflow_metrics(metrics).items():
            client.log_metric(facts["mlflow_run_id"], name, value)
    print(json.dumps({k: metrics[k] for k in sorted(metrics) if k.startswith(("acceptance", "step_time"))},
                     indent=2))
    for t in td.eval_temperatures:
        print(f"T = {t}: acceptance by prompt source / by target entropy (nats):")
        for part in metrics[f"breakdown_test_T{t}"].values():
            print("  " + ", ".join(f"{k} {v['acceptance']:.3f} ({v['positions']})" for k, v in part.items()))
    return 0
