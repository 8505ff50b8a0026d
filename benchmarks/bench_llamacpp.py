"""Our autoregressive loop next to llama.cpp on the embedded target's own GGUF file (issue #45's anchor).

    python -m benchmarks.bench_llamacpp [--prompts 4] [--tokens 64] [--rounds 2] [--threads 2]

llama.cpp runs in a benchmark-only environment that the project does not depend on: `make llamacpp` builds
llama-cpp-python from its source package into ``.cache/bench-llamacpp`` (or point ``$BRANCHPOINT_LLAMACPP_PYTHON``
at a Python that imports ``llama_cpp``). Where that Python is missing or cannot load the model, the benchmark prints
one line saying so and exits 0 without writing results.

Both decode the same token ids (HumanEval prompts through the project's chat template, `encode_prompt`), the
same number of new tokens, sampling at temperature 1 from the whole distribution, with the same threads;
rounds interleave the two prompt by prompt so that a slow phase of the machine hits both. Per prompt:
decode tokens/s = (tokens - 1) / (seconds after the first token), so the prefill is excluded on both sides.
Also llama.cpp's prompt lookup decoding (llama-cpp-python's ``LlamaPromptLookupDecoding``, 4 tokens), next to
our prompt lookup policy (`policies.lookup`, ``lookup:4``). Bytes read per step: the weights a plain step reads
(ours: `models.quantized.linear_bytes` of the target as the pipeline loads it, ``model.backend: auto``; llama.cpp:
the GGUF's tensor data), and the GB/s that implies.

Writes benchmarks/results/llamacpp.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "llamacpp.json"
ENV_PYTHON = ROOT / ".cache" / "bench-llamacpp" / "bin" / "python"
TARGET = "embedded:smollm2-135m-instruct"


def llama_python() -> Path | None:
    """The benchmark environment's Python, or None when there is none."""
    path = Path(os.environ.get("BRANCHPOINT_LLAMACPP_PYTHON", ENV_PYTHON))
    return path if path.is_file() else None


class LlamaWorker:
    """`benchmarks/llamacpp_worker.py` in the benchmark environment, one JSON request per line."""

    def __init__(self, python: Path, gguf: Path, threads: int) -> None:
        worker = ROOT / "benchmarks" / "llamacpp_worker.py"
        self.proc = subprocess.Popen([str(python), str(worker), str(gguf), str(threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        if not ready:
            err = self.proc.stderr.read().strip().splitlines()
            raise RuntimeError(f"llama.cpp worker exited {self.proc.wait()}: {err[-1] if err else 'no output'}")
        self.version = json.loads(ready)["ready"]

    def _ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"llama.cpp worker died (exit {self.proc.wait()}) during a {request['mode']} request")
        return json.loads(line)

    def decode(self, prompt: list[int], tokens: int, mode: str, seed: int) -> dict:
        return self._ask({"prompt": prompt, "tokens": tokens, "mode": mode, "seed": seed})

    def perplexity(self, texts: list[list[int]]) -> float:
        """llama.cpp's held-out perplexity of ``texts`` (token ids), teacher-forced as `bench_target_backend`'s."""
        answers = [self._ask({"prompt": ids, "mode": "score"}) for ids in texts]
        return math.exp(sum(a["nll"] for a in answers) / sum(a["count"] for a in answers))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=30)


def test_prompts(count: int, tokenizer) -> list[list[int]]:
    from data_collection.prompts import encode_prompt, load_prompt_set

    texts = load_prompt_set("humaneval")["text"][-count:]  # the last ones: never the draft's distillation prompts
    return [encode_prompt(t, tokenizer) for t in texts]


def ours_decoder(threads: int):
    """``(decode(prompt, tokens, mode, seed) -> result like the worker's, weight bytes per step, tokenizer)``: the
    target as the pipeline loads it (``model.backend: auto``)."""
    import torch

    from decoding.sampling import Sampling
    from engine.decoder import SpeculativeDecoder
    from models.loading import Placement, load_model, load_tokenizer
    from models.quantized import backend_of, linear_bytes
    from policies.registry import build_policy

    torch.set_num_threads(threads)
    model = load_model(TARGET, torch.device("cpu"), torch.float32, placement=Placement(backend="auto"))
    print(f"bench_llamacpp: our target on backend {backend_of(model)}", flush=True)
    decoder = SpeculativeDecoder(model, None)
    weight_bytes = linear_bytes(model)
    policies = {"plain": build_policy("autoregressive"), "lookup": build_policy("prompt_lookup", {"length": 4})}

    def decode(prompt: list[int], tokens: int, mode: str, seed: int) -> dict:
        built = policies[mode]
        built.policy.reset()
        result = decoder.generate(prompt, tokens, built.method, built.policy, Sampling(1.0), seed)
        s = result.stats
        # the first token of a decode comes with the prefill; its step is a plain step too
        return {"tokens": s.new_tokens, "prefill_seconds": s.time_prefill, "decode_seconds": s.decode_seconds}

    return decode, weight_bytes, load_tokenizer(TARGET)


def tokens_per_second(runs: list[dict]) -> float:
    """Decode tokens/s over runs: (tokens - 1) per run over the seconds after the first token."""
    return sum(r["tokens"] - 1 for r in runs) / sum(r["decode_seconds"] for r in runs)


def gguf_tensor_bytes(path: Path) -> int:
    from gguf import GGUFReader

    return int(sum(t.n_bytes for t in GGUFReader(str(path)).tensors))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4, help="HumanEval prompts (the last ones)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per decode")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds over the prompts")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    python = llama_python()
    if python is None:
        print("bench_llamacpp: skipped, no llama.cpp environment (`make llamacpp` builds one into "
              ".cache/bench-llamacpp, or set BRANCHPOINT_LLAMACPP_PYTHON)")
        return 0
    from decoding.files import write_json_atomic
    from models.loading import embedded_gguf_path

    gguf = embedded_gguf_path(TARGET.split(":", 1)[1])
    try:
        llama = LlamaWorker(python, gguf, args.threads)
    except RuntimeError as e:
        print(f"bench_llamacpp: skipped, llama.cpp could not start on {gguf.name}: {e}")
        return 0
    decode, ours_bytes, tokenizer = ours_decoder(args.threads)
    prompts = test_prompts(args.prompts, tokenizer)
    runs: dict[str, list[dict]] = {k: [] for k in ("ours_plain", "llamacpp_plain", "ours_lookup", "llamacpp_lookup")}
    try:
        decode(prompts[0], 4, "plain", 0)  # warm-up, untimed
        llama.decode(prompts[0], 4, "plain", 0)
        for r in range(args.rounds):
            for i, prompt in enumerate(prompts):
                for mode in ("plain", "lookup"):
                    seed = 1000 * r + i
                    runs[f"ours_{mode}"].append(decode(prompt, args.tokens, mode, seed))
                    runs[f"llamacpp_{mode}"].append(llama.decode(prompt, args.tokens, mode, seed))
                print(f"bench_llamacpp: round {r + 1}/{args.rounds}, prompt {i + 1}/{len(prompts)}", flush=True)
    finally:
        llama.close()
    tps = {k: tokens_per_second(v) for k, v in runs.items()}
    per_prompt = {k: [(r["tokens"] - 1) / r["decode_seconds"] for r in v] for k, v in runs.items()}
    llama_bytes = gguf_tensor_bytes(gguf)
    result = {
        "machine": {"threads": args.threads, "cpu": _cpu_name()},
        "llama_cpp_python": llama.version, "gguf": gguf.name,
        "setup": {"prompts": len(prompts), "tokens": args.tokens, "rounds": args.rounds,
                  "sampling": "temperature 1, whole distribution", "order": "interleaved prompt by prompt"},
        "decode_tokens_per_second": tps,
        "per_prompt_median_tokens_per_second": {k: statistics.median(v) for k, v in per_prompt.items()},
        "ours_vs_llamacpp_plain": tps["ours_plain"] / tps["llamacpp_plain"],
        "ours_vs_llamacpp_lookup": tps["ours_lookup"] / tps["llamacpp_lookup"],
        "bytes_per_plain_step": {"ours": ours_bytes, "llamacpp": llama_bytes},
        "implied_gb_per_second": {"ours": ours_bytes * tps["ours_plain"] / 1e9,
                                  "llamacpp": llama_bytes * tps["llamacpp_plain"] / 1e9},
        "runs": runs,
    }
    write_json_atomic(args.out, result)
    print(json.dumps({k: result[k] for k in ("decode_tokens_per_second", "ours_vs_llamacpp_plain",
                                             "ours_vs_llamacpp_lookup", "implied_gb_per_second")}, indent=1))
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
