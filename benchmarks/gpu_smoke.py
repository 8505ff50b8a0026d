"""The path a GPU user takes, end to end in one command -> benchmarks/results/gpu_smoke.json (``make gpu-smoke``).

1. HF model folders made from the embedded SmolLM2-135M-Instruct: the target (every layer) and a draft of its first
   ``--draft-layers`` layers (an untrained early exit: a stand-in for a user's own small HF model); for the CPU twin
   also a tiny random-weight Llama with SmolLM2's tokenizer (2 layers, hidden 64: a target the self-draft path
   runs on in minutes in bfloat16 on 2 cores).
2. The whole pipeline in dvc.yaml's stage order on the quick preset (``configs/quick.yaml``), each stage one
   ``branchpoint`` process in a fresh run folder (``--work``/<run>), timed; ``--runs`` picks which:

   - ``hf_draft``: ``model.target=hf:<target>``, ``model.draft=hf:<draft>`` in ``--dtype``; stage train_draft
     measures the HF draft and trains nothing;
   - ``self_draft``: the default path, ``model.draft`` the self-draft that stage train_draft distils on the
     device, over ``--self-draft-target`` (default: the SmolLM2 target on CUDA, the tiny one elsewhere) in
     ``--self-draft-dtype`` (default: ``--dtype`` on CUDA, bfloat16 elsewhere, so the CPU twin runs the self-draft
     on HF's decoder layers, as a GPU does, not on the CPU float32 lean path).

   The profile times target passes of 1..16 tokens.
3. Our autoregressive loop's tokens/s next to transformers' ``generate()`` on the SmolLM2 target, same device and
   dtype, and the engine's host overhead per step (`benchmarks.smoke_ar`).
4. The JSON: per run, seconds per stage, the target's tree pass over n tokens / a plain step (n = 1..16, at the
   profile's smallest and largest context), the draft as measured (kind, acceptance, step-time ratio), the
   selector's online ratios (metrics/headline.json); then the autoregressive comparison and where it ran.

Budget: each run under 10 minutes on one GPU (``--budget``; the JSON says whether they held). ``--device cpu`` is
the CPU twin (``make gpu-smoke DEVICE=cpu``, part of ``make bench``; it writes gpu_smoke_cpu.json). Without a GPU,
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
RUNS = ("hf_draft", "self_draft")
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2}
# the self-draft's shape on the tiny target (its first layer, a small adapter, a 4,096-token subset), and a profile
# that measures each step class once (bf16 on CPU runs unpacked: the preset's 4 rounds of 16 tokens took 15 minutes)
TINY_DRAFT = {"train_draft.layers": "1", "train_draft.adapter_width": "64", "train_draft.vocab_subset_size": "4096",
              "profile.price_rounds": "1", "profile.price_tokens": "8", "profile.verify_repeats": "1"}
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


def make_tiny_folder(models: Path, cache_dir: Path) -> Path:
    """``models/tiny``: a random-weight Llama (`TINY`) with SmolLM2's tokenizer and vocabulary, its tied embedding
    scaled so the head's distributions are peaked (random init gives near-uniform rows); made once."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from models.loading import resolve_model_folder

    folder = models / "tiny"
    if (folder / "config.json").is_file():
        return folder
    source = resolve_model_folder(EMBEDDED, cache_dir)
    tok = AutoTokenizer.from_pretrained(source)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), tie_word_embeddings=True, max_position_embeddings=2048,
                                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **TINY))
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(25.0)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tok.save_pretrained(partial)
    partial.rename(folder)
    return folder


def stage_overrides(target: Path, draft: Path | None, device: str, dtype: str, cache_dir: Path) -> list[str]:
    """``--set`` flags of every stage; ``draft=None`` keeps the preset's draft (the self-draft train_draft distils)."""
    sets = {"model.target": f"hf:{target}", "model.device": device,
            "model.dtype": dtype, "model.cache_dir": str(cache_dir),
            "profile.target_tokens": "[" + ", ".join(map(str, TREE_TOKENS)) + "]",
            "train.accelerator": "gpu" if device.startswith("cuda") else "cpu"}
    if draft is not None:
        sets["model.draft"] = f"hf:{draft}"
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


def pipeline_result(run: Path, preset: Path, overrides: list[str], budget: float) -> dict:
    """Every stage in ``run`` (fresh), then what the JSON reports of it."""
    shutil.rmtree(run, ignore_errors=True)
    seconds = run_stages(run, preset, overrides)
    total = sum(seconds.values())
    return {"stage_seconds": seconds, "pipeline_seconds": total, "within_budget": total <= budget,
            "tree_pass_over_step": tree_pass_ratios(run / "artifacts" / "latency.json"),
            "draft": draft_summary(run / "metrics" / "draft.json"),
            "online": online_summary(run / "metrics" / "headline.json")}


def run_plans(args, models: Path, cache_dir: Path) -> dict[str, tuple[dict, list[str]]]:
    """Run name -> (its pair and dtype as the JSON names them, its ``--set`` flags), for the runs ``--runs`` asks."""
    runs = [r for r in args.runs.split(",") if r]
    if unknown := set(runs) - set(RUNS):
        raise SystemExit(f"gpu-smoke: unknown run(s) {sorted(unknown)}; --runs takes a comma list of {', '.join(RUNS)}")
    target, draft = make_hf_folders(models, args.draft_layers, cache_dir)
    plans = {}
    if "hf_draft" in runs:
        pair = {"target": f"hf: SmolLM2-135M-Instruct ({EMBEDDED}) saved as an HF folder",
                "draft": f"hf: its first {args.draft_layers} layers saved as an HF folder (untrained early exit)",
                "dtype": args.dtype}
        plans["hf_draft"] = (pair, stage_overrides(target, draft, args.device, args.dtype, cache_dir))
    if "self_draft" in runs:
        on_gpu = args.device.startswith("cuda")
        tiny = (args.self_draft_target or ("target" if on_gpu else "tiny")) == "tiny"
        dtype = args.self_draft_dtype or (args.dtype if on_gpu else "bfloat16")
        base = make_tiny_folder(models, cache_dir) if tiny else target
        pair = {"target": f"hf: a tiny random Llama {TINY} with SmolLM2's tokenizer" if tiny else
                f"hf: SmolLM2-135M-Instruct ({EMBEDDED}) saved as an HF folder",
                "draft": "self_draft: distilled by stage train_draft" + (f" ({TINY_DRAFT})" if tiny else ""),
                "dtype": dtype}
        flags = [a for k, v in TINY_DRAFT.items() for a in ("--set", f"{k}={v}")] if tiny else []
        plans["self_draft"] = (pair, stage_overrides(base, None, args.device, dtype, cache_dir) + flags)
    return plans


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="model.device of every stage (default: %(default)s)")
    parser.add_argument("--dtype", default="bfloat16", help="model.dtype (default: %(default)s)")
    parser.add_argument("--draft-layers", type=int, default=8, help="layers of the HF draft folder (default: 8)")
    parser.add_argument("--runs", default=",".join(RUNS), help="comma list of pipeline runs (default: %(default)s)")
    parser.add_argument("--self-draft-target", choices=("target", "tiny"), default=None,
                        help="the self_draft run's target (default: target on CUDA, tiny elsewhere)")
    parser.add_argument("--self-draft-dtype", default=None,
                        help="the self_draft run's model.dtype (default: --dtype on CUDA, bfloat16 elsewhere)")
    parser.add_argument("--ar-tokens", type=int, default=32,
                        help="tokens of the autoregressive comparison with generate(); 0 skips it (default: 32)")
    parser.add_argument("--preset", default=str(PRESET), help="params file (default: configs/quick.yaml)")
    parser.add_argument("--work", default=str(ROOT / ".cache" / "gpu_smoke"), help="models/ and the runs go here")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds each pipeline run should take")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/gpu_smoke[_cpu].json")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="one more params override for every stage (e.g. to shrink the CPU twin on a busy machine)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device_name = check_device(args.device)
    import torch

    from benchmarks.smoke_ar import ar_vs_generate
    from decoding.files import write_json_atomic
    from models.loading import resolve_dtype

    work, cache_dir = Path(args.work).resolve(), ROOT / ".cache" / "branchpoint"
    start = time.perf_counter()
    plans = run_plans(args, work / "models", cache_dir)
    extra = [a for e in args.extra for a in ("--set", e)]
    result = {
        "where": {"device": args.device, "device_name": device_name, "dtype": args.dtype, "cpu_count": os.cpu_count(),
                  "torch": torch.__version__, "transformers": _transformers_version(),
                  "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
        "preset": args.preset.removeprefix(str(ROOT) + "/"), "extra_overrides": args.extra,
        "hf_folders_seconds": time.perf_counter() - start, "budget_seconds": args.budget, "runs": {},
    }
    for name, (pair, flags) in plans.items():
        print(f"gpu-smoke: run {name}: {pair['target']}, draft {pair['draft']}, {pair['dtype']}", flush=True)
        result["runs"][name] = {"pair": pair, **pipeline_result(work / name, Path(args.preset).resolve(),
                                                                  flags + extra, args.budget)}
    result["within_budget"] = all(r["within_budget"] for r in result["runs"].values())
    if args.ar_tokens:
        result["autoregressive_vs_generate"] = ar_vs_generate(work / "models" / "target", torch.device(args.device),
                                                              resolve_dtype(args.dtype), args.ar_tokens)
    out = Path(args.out) if args.out else default_out(args.device)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, result)
    for name, r in result["runs"].items():
        print(f"gpu-smoke: {name}: pipeline {r['pipeline_seconds']:.0f} s (budget {args.budget:.0f} s); draft "
              f"{r['draft']['kind']}; selector vs autoregressive {r['online']['selector_vs_ar']}")
    print(f"gpu-smoke: on {args.device} ({device_name}), {args.dtype}; "
          f"ours vs generate() {result.get('autoregressive_vs_generate')} -> {out}")
    return 0


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


if __name__ == "__main__":
    raise SystemExit(main())
