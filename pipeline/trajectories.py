"""``branchpoint trajectories``: stage trajectories, target-sampled continuations of every prompt.

Reads: params ``model.*``, ``prompts.*``, ``trajectories.*``. Writes: the folder ``trajectories.out``
(``trajectories.parquet`` + ``manifest.json``, see `data_collection.trajectory_store`). Steps:

1. load the prompt sets and split them by prompt into draft / train / val / test;
2. encode each prompt with the chat template (`data_collection.prompts.encode_prompt`);
3. give each prompt its settings: ``draft`` prompts T = 1, top-p 1 (what distillation needs); a
   train/val/test prompt one setting of the grid ``temperatures x top_ps`` picked by a seeded hash of its
   id (``all_settings: true``: every setting); ``samples_per_prompt`` trajectories per (prompt, setting)
   (``draft_samples_per_prompt`` per draft prompt: more distillation data), each with a seed hashed from (seed, prompt id, setting, sample), so a prompt's trajectories do not
   change when prompts are added or the batch size changes;
4. sample them in batches (`models.sampler`) and save them once. train_draft and collect read them;
   nothing samples the same continuations again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

SECTIONS = ("model", "prompts", "trajectories")  # the params sections it loads


DRAFT_SETTING = (1.0, 1.0)  # (temperature, top_p) of the draft split: distillation targets p at T = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar (tokens sampled, ETA)")


def settings_of(cfg, prompt_id: str, split: str) -> list[tuple[float, float]]:
    """The (temperature, top_p) settings a prompt is sampled at (step 3 of the module docstring)."""
    from data_collection.prompts import unit_hash

    tc = cfg.trajectories
    if split == "draft":
        return [DRAFT_SETTING]
    grid = [(float(t), float(p)) for t in tc.temperatures for p in tc.top_ps]
    if tc.all_settings:
        return grid
    return [grid[int(unit_hash(tc.seed, "setting", prompt_id) * len(grid))]]


def row_seed(seed: int, prompt_id: str, setting: tuple[float, float], sample: int) -> int:
    from data_collection.prompts import unit_hash

    return int(unit_hash(seed, "sample", prompt_id, *setting, sample) * 2**63)


def plan(cfg, tokenizer) -> list[dict]:
    """One entry per trajectory to sample: prompt fields, split, setting, sample, prompt ids and seed."""
    from data_collection.prompts import SPLITS, encode_prompt, load_prompt_set, split_prompts

    tc = cfg.trajectories
    prompts = load_prompt_set(cfg.prompts.sets, max_prompts=cfg.prompts.max_prompts)
    splits = split_prompts(prompts, tuple(cfg.prompts.split), seed=cfg.prompts.seed)
    entries = []
    for split in SPLITS:
        for pid, source, text in zip(*(splits[split][c] for c in ("prompt_id", "source", "text")), strict=True):
            ids = encode_prompt(text, tokenizer, cfg.prompts.chat_template)[-tc.max_prompt_tokens:]
            samples = tc.draft_samples_per_prompt if split == "draft" else tc.samples_per_prompt
            for setting in settings_of(cfg, pid, split):
                for sample in range(samples):
                    entries.append({"prompt_id": pid, "source": source, "split": split, "temperature": setting[0],
                                    "top_p": setting[1], "sample": sample, "prompt_ids": ids,
                                    "seed": row_seed(tc.seed, pid, setting, sample)})
    return entries


def sample_trajectories(cfg, target, tokenizer, progress: bool = True) -> list:
    """Steps 1-4 without saving: the `Trajectory` list in split, prompt, setting, sample order."""
    from data_collection.trajectory_store import Trajectory
    from decoding.sampling import Sampling
    from models.loading import eos_ids
    from models.sampler import Row, sample_continuations

    tc = cfg.trajectories
    entries = plan(cfg, tokenizer)
    rows = [Row(e["prompt_ids"], Sampling(e["temperature"], e["top_p"]), e["seed"]) for e in entries]
    conts = sample_continuations(target, rows, tc.max_new_tokens, eos_ids(tokenizer, target), batch_size=tc.batch_size,
                                 progress="sampling trajectories" if progress else None)
    fields = {f.name for f in dataclasses.fields(Trajectory)}
    return [Trajectory(**{k: v for k, v in e.items() if k in fields}, continuation_ids=c)
            for e, c in zip(entries, conts, strict=True)]


def run(cfg, args) -> int:
    import torch

    from data_collection.trajectory_store import save_trajectories
    from models.loading import (
        eos_ids,
        input_device,
        load_model,
        load_tokenizer,
        resolve_device,
        resolve_dtype,
    )
    from models.quantized import backend_of
    from models.self_draft import target_fingerprint

    tc = cfg.trajectories
    torch.set_num_threads(tc.threads)
    device, dtype = resolve_device(cfg.model.device), resolve_dtype(cfg.model.dtype)
    tokenizer = load_tokenizer(cfg.model.target, cfg.model.cache_dir)
    target = load_model(cfg.model.target, device, dtype, cfg.model.cache_dir, cfg.model.placement())
    device = input_device(target)  # = device, unless model.device_map spread the target
    start = time.perf_counter()
    trajectories = sample_trajectories(cfg, target, tokenizer, progress=not args.no_progress)
    seconds = time.perf_counter() - start
    tokens = sum(len(t.continuation_ids) for t in trajectories)
    manifest = {
        "config": {"trajectories": dataclasses.asdict(tc), "prompts": dataclasses.asdict(cfg.prompts)},
        "target": cfg.model.target, "dtype": cfg.model.dtype, "backend": backend_of(target),
        "device": str(device),
        "target_fingerprint": target_fingerprint(target),
        "tokenizer": getattr(tokenizer, "name_or_path", None), "eos_ids": eos_ids(tokenizer, target),
        "sampling_seconds": round(seconds, 1), "tokens_per_second": round(tokens / max(seconds, 1e-9), 1),
    }
    folder = save_trajectories(tc.out, trajectories, manifest)
    counts = json.loads((folder / "manifest.json").read_text())["counts"]
    print(f"{len(trajectories)} trajectories, {tokens} tokens in {seconds:.0f} s "
          f"({tokens / max(seconds, 1e-9):.0f} tokens/s, {tc.threads} threads) -> {folder}/")
    for split, c in counts.items():
        print(f"  {split}: {c['trajectories']} trajectories, {c['tokens']} tokens, {c['settings']}")
    return 0
