"""``branchpoint info``: the resolved config, library versions, the device, and the loaded pair.

``--layout`` prints the code base's counts instead (`pipeline/layout.py`); ``python -m pipeline.info --layout``
prints them with no params file.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import time

SECTIONS = None  # every section: info prints the resolved config


PACKAGES = ["torch", "transformers", "pytorch-lightning", "datasets", "mlflow", "onnxruntime", "dvc", "numpy"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-models", action="store_true", help="skip loading the model pair")
    parser.add_argument("--layout", action="store_true",
                        help="print modules and lines per package, the functions with the most parameters and the "
                             "function-local imports (pipeline/layout.py), and nothing else")


def versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def print_prompt_summary(cfg) -> None:
    """Prompt counts per source and split (loads the sets, so bad prompt specs fail here)."""
    from collections import Counter

    from data_collection.prompts import load_prompt_set, split_prompts

    prompts = load_prompt_set(cfg.prompts.sets, max_prompts=cfg.prompts.max_prompts)
    splits = split_prompts(prompts, tuple(cfg.prompts.split), seed=cfg.prompts.seed)
    counts = {name: dict(Counter(ds["source"])) for name, ds in splits.items()}
    print(f"prompts: {len(prompts)} total; by split and source: {json.dumps(counts)}")


def print_layout() -> int:
    from pipeline.layout import format_layout, layout

    print(format_layout(layout()))
    return 0


def run(cfg, args) -> int:
    if args.layout:
        return print_layout()
    import torch

    from models.loading import load_pair, resolve_device

    print(f"config ({cfg.source}):")
    print(json.dumps(cfg.to_dict(), indent=2))
    print("versions:", json.dumps(versions()))
    device = resolve_device(cfg.model.device)
    cuda = torch.cuda.get_device_name(device) if device.type == "cuda" else "no CUDA"
    print(f"device: {device} ({cuda}; {torch.get_num_threads()} CPU threads)")
    print_prompt_summary(cfg)
    if args.no_models:
        return 0
    start = time.perf_counter()
    pair = load_pair(cfg.model.target, cfg.model.draft, cfg.model.device, cfg.model.dtype, cfg.model.cache_dir,
                     cfg.model.placement())
    print(f"pair loaded in {time.perf_counter() - start:.1f} s:")
    print(json.dumps(pair.describe(), indent=2))
    return 0


if __name__ == "__main__":  # python -m pipeline.info --layout: the counts alone, no params file
    cli = argparse.ArgumentParser(prog="python -m pipeline.info", description="the code base's counts")
    cli.add_argument("--layout", action="store_true", required=True, help="print the counts (pipeline/layout.py)")
    cli.parse_args()
    raise SystemExit(print_layout())
