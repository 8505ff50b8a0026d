"""The path a GPU user takes, end to end in one command -> benchmarks/results/gpu_smoke.json (``make gpu-smoke``).

1. Two HF model folders made from the embedded SmolLM2-135M-Instruct: the target (every layer) and a draft of its
   first ``--draft-layers`` layers (an untrained early exit: a stand-in for a user's own small HF model).
2. The whole pipeline in dvc.yaml's stage order on the quick preset (``configs/quick.yaml``) with
   ``model.target=hf:<target>``, ``model.draft=hf:<draft>``, ``model.device=--device``, ``model.dtype=--dtype``:
   each stage one ``branchpoint`` process in a fresh run folder (``--work``/run), timed. Stage train_draft
   measures the HF draft and trains nothing. The profile times target passes of 1..16 tokens.
3. The JSON: seconds per stage, the target's tree pass over n tokens / a plain step (n = 1..16, at the profile's
   smallest and largest context), the draft as measured (kind, acceptance, step-time ratio), the selector's online
   ratios (metrics/headline.json), and where it ran.

Budget: under 10 minutes on one GPU (``--budget``; the JSON says whether it held). ``--device cpu`` is the CPU twin
(``make gpu-smoke DEVICE=cpu``, part of ``make bench``; it writes gpu_smoke_cpu.json). Without a GPU,
``--device cuda`` stops before any work with a message saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = "embedded:smollm2-135m-instruct"
PRESET = ROOT / "configs" / "quick.yaml"
STAGES = ("trajectories", "profile", "train-draft", "collect", "train", "export", "evaluate", "headline")
TREE_TOKENS = list(range(1, 17))


def default_out(device: str) -> Path:
    """benchmarks/results/gpu_smoke.json on CUDA, gpu_smoke_<device>.json elsewhere (the CPU twin)."""
    suffix = "" if device.startswith("cuda") else f"_{device.split(':')[0]}"
    return ROOT / "benchmarks" / "results" / f"gpu_smoke{suffix}.json"


def check_device(device: str) -> str:
    """The device's name; a clear exit when CUDA is asked for and absent."""
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SystemExit(f"gpu-smoke: --device {device} but torch sees no CUDA device on this machine; run the CPU "
                             "twin with `make gpu-smoke DEVICE=cpu`")
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def make_hf_folders(models: Path, draft_layers: int, cache_dir: Path) -> tuple[Path, Path]:
    """``models/target`` and ``models/draft<k>`` (float32 safetensors + tokenizer), made once and reused."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.loading import resolve_model_folder

    source = resolve_model_folder(EMBEDDED, cache_dir)
    out = {"target": models / "target", "draft": models / f"draft{draft_layers}"}
    for name, folder in out.items():
        if (folder / "config.json").is_file():
            continue
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
        if name == "draft":
            if not 0 < draft_layers < model.config.num_hidden_layers:
                raise SystemExit(f"gpu-smoke: --draft-layers must be in 1..{model.config.num_hidden_layers - 1}")
            model.model.layers = model.model.layers[:draft_layers]
            model.config.num_hidden_layers = draft_layers
            if getattr(model.config, "layer_types", None):
                model.config.layer_types = model.config.layer_types[:draft_layers]
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial)
        AutoTokenizer.from_pretrained(source).save_pretrained(partial)
        partial.rename(folder)  # a folder appears whole or not at all
    return out["target"], out["draft"]


def stage_overrides(target: Path, draft: Path, device: str, dtype: str, cache_dir: Path) -> list[str]:
    sets = {"model.target": f"hf:{target}", "model.draft": f"hf:{draft}", "model.device": device,
            "model.dtype": dtype, "model.cache_dir": str(cache_dir),
            "profile.target_tokens": "[" + ", ".join(map(str, TREE_TOKENS)) + "]",
            "train.accelerator": "gpu" if device.startswith("cuda") else "cpu"}
    return [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]


def run_stages(run: Path, preset: Path, overrides: list[str]) -> dict[str, float]:
    """Every stage as its own process in ``run`` (logs in run/logs/); seconds per stage. Stops at a failing one."""
    (run / "logs").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false"}
    seconds = {}
    for stage in STAGES:
        log = run / "logs" / f"{stage}.log"
        start = time.perf_counter()
        with log.open("w") as f:
            done = subprocess.run([sys.executable, "-m", "pipeline.cli", stage, "--params", str(preset), *overrides],
                                  cwd=run, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
        seconds[stage] = time.perf_counter() - start
        print(f"gpu-smoke: {stage:<12} {seconds[stage]:6.1f} s", flush=True)
        if done.returncode != 0:
            tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:])
            raise SystemExit(f"gpu-smoke: stage {stage} failed (exit {done.returncode}); its log {log} ends:\n{tail}")
    return seconds


def tree_pass_ratios(latency_file: Path) -> dict[str, dict[str, float]]:
    """Target pass over n tokens / a plain step (n = 1), n = 1..16, at the profile's smallest and largest context."""
    prof = json.loads(latency_file.read_text())
    tokens, seconds, contexts = prof["target_tokens"], prof["target_seconds"], prof["contexts"]
    out = {}
    for c in sorted({0, len(contexts) - 1}):
        row, key = seconds[c], f"context_{int(contexts[c])}"
        out[key] = {str(int(n)): row[i] / row[0] for i, n in enumerate(tokens) if int(n) in TREE_TOKENS}
        out[key]["plain_step_ms"] = 1e3 * row[0]
    return out


def draft_summary(metrics_file: Path) -> dict:
    d = json.loads(metrics_file.read_text())
    keep = ("draft", "kind", "step_time_ratio", "draft_step_ms", "target_step_ms")
    return {**{k: d.get(k) for k in keep}, **{k: v for k, v in d.items() if k.startswith("acceptance_test_")}}


def online_summary(headline_file: Path) -> dict:
    h = json.loads(headline_file.read_text())["headline"]
    keys = ("selector_vs_ar", "selector_vs_ar_lo", "selector_vs_ar_hi", "lookup_then_selector_vs_ar",
            "selector_vs_best_static", "selector_tokens_per_second", "selector_block_efficiency", "draft_acceptance")
    return {k: h.get(k) for k in keys}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="model.device of every stage (default: %(default)s)")
    parser.add_argument("--dtype", default="bfloat16", help="model.dtype (default: %(default)s)")
    parser.add_argument("--draft-layers", type=int, default=8, help="layers of the HF draft folder (default: 8)")
    parser.add_argument("--preset", default=str(PRESET), help="params file (default: configs/quick.yaml)")
    parser.add_argument("--work", default=str(ROOT / ".cache" / "gpu_smoke"), help="models/ and run/ go here")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds the whole pipeline should take")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/gpu_smoke[_cpu].json")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="one more params override for every stage (e.g. to shrink the CPU twin on a busy machine)")
    args = parser.parse_args(argv)
    device_name = check_device(args.device)
    import torch

    from decoding.files import write_json_atomic

    work, cache_dir = Path(args.work).resolve(), ROOT / ".cache" / "branchpoint"
    start = time.perf_counter()
    target, draft = make_hf_folders(work / "models", args.draft_layers, cache_dir)
    folders_seconds = time.perf_counter() - start
    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    overrides = stage_overrides(target, draft, args.device, args.dtype, cache_dir)
    seconds = run_stages(run, Path(args.preset).resolve(), overrides + [a for e in args.extra for a in ("--set", e)])
    total = sum(seconds.values())
    result = {
        "where": {"device": args.device, "device_name": device_name, "dtype": args.dtype, "cpu_count": os.cpu_count(),
                  "torch": torch.__version__, "python": platform.python_version(),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
        "pair": {"target": f"hf: SmolLM2-135M-Instruct ({EMBEDDED}) saved as an HF folder",
                 "draft": f"hf: its first {args.draft_layers} layers saved as an HF folder (untrained early exit)"},
        "preset": args.preset.removeprefix(str(ROOT) + "/"), "extra_overrides": args.extra,
        "stage_seconds": seconds, "pipeline_seconds": total, "hf_folders_seconds": folders_seconds,
        "budget_seconds": args.budget, "within_budget": total <= args.budget,
        "tree_pass_over_step": tree_pass_ratios(run / "artifacts" / "latency.json"),
        "draft": draft_summary(run / "metrics" / "draft.json"),
        "online": online_summary(run / "metrics" / "headline.json"),
    }
    out = Path(args.out) if args.out else default_out(args.device)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, result)
    print(f"gpu-smoke: pipeline {total:.0f} s (budget {args.budget:.0f} s) on {args.device} ({device_name}), "
          f"{args.dtype}; draft {result['draft']['kind']}; selector vs autoregressive "
          f"{result['online']['selector_vs_ar']} -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
