"""``branchpoint train-draft``: stage train_draft, the trained draft of the target.

Reads: params ``model.*``, ``trajectories.out``, ``train_draft.*`` and the trajectories folder (stage
trajectories). Writes: the artifact folder ``train_draft.out`` (adapter.safetensors + config.json; loaded
as the draft spec ``<kind>:<out>``) and ``train_draft.metrics`` (metrics/draft.json). The kind is the scheme of
``model.draft``: ``self_draft`` (the target's first ``train_draft.layers`` layers plus an adapter,
`models.self_draft`) or ``eagle`` (a head on the target's last hidden state and the sampled token,
`models.eagle_draft`; ``train_draft.layers`` does not apply). Steps:

1. teacher force the stored trajectories on ``model.threads`` cores (one forward per batch of sequences;
   nothing is sampled here):
   distillation records of the DRAFT split (training) and of the VAL split (validation). Validation uses
   the selector's VAL prompts rather than a held-out slice of the draft prompts: it only monitors
   (no checkpoint selection, no early stopping), so nothing of VAL leaks into the draft; it measures the
   draft on prompts it never trained on, as the selector's roots will see it; and it costs no extra
   sampling and keeps every draft prompt for training;
2. rank the vocabulary subset, then distill the adapter with Lightning, logging to MLflow;
3. save the artifact, reload it through `models.loading.load_draft` (the path the decoder uses) and evaluate it on
   the TEST split's trajectories: token acceptance at each trajectory's own sampling setting, and the
   draft/target step time.

``--evaluate-only`` runs step 3 on the existing artifact (anyone can re-measure the metrics).

A pair whose draft is not this stage's (``model.draft`` an ``hf:``, ``gguf:`` or ``embedded:`` model, or
a ``self_draft:`` / ``eagle:`` folder other than ``train_draft.out``) trains nothing: the stage measures that draft with step 3
alone and writes, besides the metrics, only a marker ``measured.json`` into ``train_draft.out`` (the dvc out).
The metrics file names the draft it describes (``draft``: its spec; ``kind``: ``distilled`` or ``measured``).
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import contextmanager
from dataclasses import fields, replace
from pathlib import Path

from decoding.files import write_json_atomic

SECTIONS = ("model", "tracking", "trajectories", "train_draft")  # the params sections it loads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--evaluate-only", action="store_true",
                        help="measure the existing artifact on the TEST prompts and write the metrics file")
    parser.add_argument("--progress", action="store_true", help="show Lightning's progress bar")


def distill_hparams(td):
    """`DistillHParams` viewed from the stage config (same field names; the config holds the defaults)."""
    from models.draft_training import DistillHParams

    return DistillHParams(**{f.name: getattr(td, f.name) for f in fields(DistillHParams)})


def self_draft_config(td, vocab_subset_size: int, fingerprint: dict):
    """`SelfDraftConfig` from the stage config, with the subset size actually ranked and the target's fingerprint."""
    from models.self_draft import SelfDraftConfig

    return SelfDraftConfig(layers=td.layers, adapter_width=td.adapter_width, vocab_subset_size=vocab_subset_size,
                           target_fingerprint=fingerprint)


def draft_kind(cfg) -> str:
    """The kind of draft this stage trains: the scheme of ``model.draft`` (`models.loading.TRAINED_DRAFTS`)."""
    from models.loading import TRAINED_DRAFTS, parse_spec

    scheme, _ = parse_spec(cfg.model.draft)
    return scheme if scheme in TRAINED_DRAFTS else "self_draft"


def load_split_trajectories(cfg, target) -> dict[str, list]:
    """The stored trajectories by split, checked to come from ``target``."""
    from data_collection.trajectory_store import check_target, load_trajectories, read_trajectory_manifest
    from models.self_draft import fingerprint_difference

    folder = cfg.trajectories.out
    manifest = read_trajectory_manifest(folder)
    check_target(manifest, fingerprint_difference(manifest.get("target_fingerprint") or {}, target), folder)
    by_split: dict[str, list] = {"draft": [], "train": [], "val": [], "test": []}
    for t in load_trajectories(folder):
        by_split[t.split].append(t)
    return by_split


def _continuations(trajectories):
    from models.draft_data import Continuations

    return Continuations(prompts=[t.prompt_ids for t in trajectories],
                         continuations=[t.continuation_ids for t in trajectories])


@contextmanager
def _threads(n: int):
    """torch's CPU threads set to ``n`` inside the block, restored after it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _records(cfg, target, trajectories, split: str, eagle: bool = False):
    """Distillation records of ``trajectories`` (teacher-forced, `models.draft_data.DistillRecords`)."""
    from models.draft_data import distillation_records

    td = cfg.train_draft
    if not trajectories:
        raise ValueError(f"the trajectories in {cfg.trajectories.out} hold no {split.upper()} prompts; "
                         "give that split a positive fraction in prompts.split and rerun `branchpoint trajectories`")
    return distillation_records(target, _continuations(trajectories), None if eagle else td.layers, td.top_k,
                                td.forward_batch_size, progress=f"teacher forcing {split.upper()} trajectories")


def train(cfg, target, tokenizer, trajectories: dict[str, list], progress: bool = False) -> dict:
    """Steps 1-2 and the artifact; returns training facts for the metrics file."""
    from models.draft_training import DistillDataModule, RecordDataset, fit_draft, rank_vocabulary
    from models.loading import eos_ids
    from models.self_draft import SelfDraft, save_self_draft, target_fingerprint

    td = cfg.train_draft
    eagle = draft_kind(cfg) == "eagle"
    unroll = td.unroll if eagle else 1  # a self-draft drafts deeper tokens through its cache, as teacher forcing
    start = time.perf_counter()
    with _threads(cfg.model.threads):  # forwards of the frozen target: every core helps
        train_rec = _records(cfg, target, trajectories["draft"], "draft", eagle)
        val_rec = _records(cfg, target, trajectories["val"], "val", eagle)
    records_seconds = time.perf_counter() - start
    vocab = target.get_output_embeddings().weight.shape[0]
    subset = rank_vocabulary(train_rec.top_ids, train_rec.top_logp, vocab, td.vocab_subset_size,
                             always=eos_ids(tokenizer, target))
    if eagle:
        from models.eagle_draft import EagleDraft, EagleDraftConfig

        config = EagleDraftConfig(adapter_width=td.adapter_width, vocab_subset_size=int(subset.numel()),
                                  target_fingerprint=target_fingerprint(target))
        draft = EagleDraft(target, config, vocab_subset=subset)
    else:
        draft = SelfDraft(target, self_draft_config(td, int(subset.numel()), target_fingerprint(target)),
                          vocab_subset=subset)
    from pipeline.tracking import lightning_logger

    logger = lightning_logger(cfg, "train_draft", "train_draft")  # the project's experiment, nested
    logger.log_hyperparams({  # the one explicit hyperparameter log
        **{f"train_draft.{k}": v for k, v in vars(td).items()},
        "model.target": cfg.model.target, "trajectories.out": cfg.trajectories.out,
        "draft_prompts": len({t.prompt_id for t in trajectories["draft"]}),
        "train_records": train_rec.num_records, "val_records": val_rec.num_records,
    })

    def dataset(rec):
        return RecordDataset(rec.hidden, rec.top_ids, rec.top_logp, rec.record_seq, unroll=unroll)

    data = DistillDataModule(dataset(train_rec), dataset(val_rec), td.batch_size, td.seed)
    start = time.perf_counter()
    fit_draft(draft, data, replace(distill_hparams(td), unroll=unroll), logger=logger, progress=progress)
    train_seconds = time.perf_counter() - start
    coverage = _subset_coverage(subset, val_rec.top_ids, val_rec.top_logp)
    facts = {"train_seconds": train_seconds, "records_seconds": records_seconds,
             "train_records": train_rec.num_records, "val_records": val_rec.num_records,
             "vocab_subset_size": int(subset.numel()), "vocab_subset_val_mass": coverage,
             "mlflow_run_id": logger.run_id}
    save_self_draft(draft, td.out, extra=facts)
    return facts


def _subset_coverage(subset, top_ids, top_logp) -> float:
    """Mean target probability (T = 1, top-k) that falls inside the subset."""
    import torch

    inside = torch.isin(top_ids, subset)
    return float((top_logp.exp() * inside).sum(1).mean())


def setting_suffix(temperature: float, top_p: float) -> str:
    """Metric-name suffix of a sampling setting: ``T1.0``, or ``T0.6_top_p0.9`` when top-p truncates."""
    return f"T{temperature}" + ("" if top_p == 1.0 else f"_top_p{top_p}")


CHAIN_LENGTHS = (2, 4, 6)  # chains whose expected block efficiency the metrics report


def setting_stats(target, draft, test: list, depth: int = max(CHAIN_LENGTHS)) -> dict[str, tuple[list, object]]:
    """Per sampling setting of the ``test`` trajectories (keyed by its metric suffix, `setting_suffix`): those
    trajectories and the draft's acceptance at every position (`models.draft_data.PositionStats`), by depth up to
    ``depth``. The one measurement behind `measure_draft` and `benchmarks/bench_drafts.py`."""
    from models.draft_data import position_stats

    out = {}
    for temperature, top_p in sorted({t.setting for t in test}, reverse=True):
        group = [t for t in test if t.setting == (temperature, top_p)]
        stats = position_stats(target, draft, _continuations(group), [temperature], top_p, depth=depth)
        out[setting_suffix(temperature, top_p)] = (group, stats[temperature])
    return out


def measure_draft(cfg, target, tokenizer, draft, test: list, stats: dict | None = None) -> dict:
    """Step 3 for any ``draft`` of ``target``: acceptance on the TEST trajectories at each of their sampling
    settings (overall, by prompt source and by target entropy; a draft that reads its own features below the first
    token also by depth), step-time ratio, expected chain efficiency. ``stats``: `setting_stats` of these, when the
    caller has them already."""
    import torch

    from data_collection.forward_tables import TimedPair, step_times, tile_ids
    from models.draft_data import breakdown, chain_block_efficiency
    from models.loading import common_vocab_size

    td = cfg.train_draft
    if not test:
        raise ValueError(f"the trajectories in {cfg.trajectories.out} hold no TEST prompts; give that split a "
                         "positive fraction in prompts.split and rerun `branchpoint trajectories`")
    metrics: dict = {"test_prompts": len({t.prompt_id for t in test})}
    for name, (group, stats_) in (stats or setting_stats(target, draft, test)).items():
        acc = stats_.acceptance
        flat = torch.cat(acc)
        metrics[f"acceptance_test_{name}"] = float(flat.mean())
        metrics[f"test_positions_{name}"] = int(flat.numel())
        for d, rows in enumerate(stats_.deeper, start=2):
            metrics[f"acceptance_test_{name}_depth{d}"] = float(torch.cat(rows).mean())
        metrics[f"breakdown_test_{name}"] = breakdown(stats_, [t.source for t in group])
        for n in CHAIN_LENGTHS:
            metrics[f"expected_chain_block_efficiency_L{n}_{name}"] = chain_block_efficiency(acc, n, stats_.deeper)
    ids = test[0].prompt_ids
    pair = TimedPair(target, draft, common_vocab_size(target, draft, tokenizer))
    metrics.update(step_times(pair, tile_ids(ids, td.timing_context), reps=td.timing_reps))
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


MEASURED_FILE = "measured.json"  # the marker a measuring run leaves in train_draft.out


def given_draft(cfg) -> str | None:
    """The draft spec this stage measures, or None when the pair's draft is the self-draft it distils
    (``self_draft:<train_draft.out>``)."""
    from models.loading import parse_spec

    scheme, rest = parse_spec(cfg.model.draft)
    if scheme == draft_kind(cfg) and Path(rest).resolve() == Path(cfg.train_draft.out).resolve():
        return None
    return cfg.model.draft


def _mark_measured(folder: str, spec: str) -> None:
    """``folder/measured.json``: the stage's out when it measured ``spec`` instead of distilling."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(folder) / MEASURED_FILE, {"draft": spec, "kind": "measured"})


def _draft_for_metrics(cfg, args, target, tokenizer, dtype, trajectories) -> tuple:
    """(the draft to measure, facts for the metrics file): the given draft as is, or the trained draft, distilled
    first unless ``--evaluate-only``; ``dtype``: of a draft with its own model."""
    from models.loading import load_draft
    from models.self_draft import CONFIG_FILE, read_raw_config

    td = cfg.train_draft
    spec = given_draft(cfg)
    if spec is not None:
        draft = load_draft(spec, target, tokenizer, cfg.model.target, dtype, cfg.model.cache_dir)
        _mark_measured(td.out, spec)
        print(f"model.draft is {spec}, not this stage's self-draft: measuring it, nothing trained")
        return draft, {"draft": spec, "kind": "measured"}
    if args.evaluate_only:
        read_raw_config(td.out)  # clear error when the artifact is missing
        facts = json.loads((Path(td.out) / CONFIG_FILE).read_text()).get("extra", {})
    else:
        start = time.perf_counter()
        facts = train(cfg, target, tokenizer, trajectories, progress=args.progress)
        (Path(td.out) / MEASURED_FILE).unlink(missing_ok=True)
        print(f"trained in {time.perf_counter() - start:.0f} s (of which fit {facts['train_seconds']:.0f} s); "
              f"artifact: {td.out}/")
    draft = load_draft(cfg.model.draft, target, tokenizer, cfg.model.target, dtype, cfg.model.cache_dir)
    return draft, {"draft": cfg.model.draft, "kind": "distilled", **facts}


def run(cfg, args) -> int:
    import torch

    from models.loading import load_model, load_tokenizer, resolve_device, resolve_dtype

    td = cfg.train_draft
    torch.set_num_threads(td.threads)
    torch.manual_seed(td.seed)
    device, dtype = resolve_device(cfg.model.device), resolve_dtype(cfg.model.dtype)
    tokenizer = load_tokenizer(cfg.model.target, cfg.model.cache_dir)
    target = load_model(cfg.model.target, device, dtype, cfg.model.cache_dir, cfg.model.placement())
    for p in target.parameters():
        p.requires_grad_(False)
    trajectories = load_split_trajectories(cfg, target)
    draft, facts = _draft_for_metrics(cfg, args, target, tokenizer, dtype, trajectories)
    with _threads(cfg.model.threads):  # measured as the decoder runs: on model.threads cores
        metrics = {**measure_draft(cfg, target, tokenizer, draft, trajectories["test"]), **facts}
    write_json_atomic(Path(td.metrics), metrics)
    if facts.get("mlflow_run_id"):
        from mlflow.tracking import MlflowClient

        from pipeline.tracking import tracking_uri

        client = MlflowClient(tracking_uri=tracking_uri(cfg))
        for name, value in _mlflow_metrics(metrics).items():
            client.log_metric(facts["mlflow_run_id"], name, value)
    print(json.dumps({k: metrics[k] for k in sorted(metrics) if k.startswith(("acceptance", "step_time"))},
                     indent=2))
    for key in sorted(k for k in metrics if k.startswith("breakdown_test_")):
        print(f"{key.removeprefix('breakdown_test_')}: acceptance by prompt source / by target entropy (nats):")
        for part in metrics[key].values():
            print("  " + ", ".join(f"{k} {v['acceptance']:.3f} ({v['positions']})" for k, v in part.items()))
    return 0
