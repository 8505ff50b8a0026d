"""llama.cpp's side of `benchmarks.bench_llamacpp`, run by the benchmark-only environment's Python (which has
llama-cpp-python and nothing of this project).

    <llama env>/bin/python benchmarks/llamacpp_worker.py MODEL.gguf THREADS

Reads one JSON request per line on stdin, ``{"prompt": [token ids], "tokens": n, "mode": "plain" | "lookup",
"seed": s}``, decodes ``n`` tokens after the prompt (sampling at temperature 1 from the whole distribution: top-k
off, top-p 1, min-p 0; ``lookup``: llama-cpp-python's prompt lookup decoding, 4 proposed tokens) and answers one JSON
line ``{"tokens": k, "prefill_seconds": t0, "decode_seconds": t}``: the first token comes after the prompt's
evaluation (``prefill_seconds``), the other ``k - 1`` in ``decode_seconds``. ``"mode": "score"`` scores the prompt
teacher-forced instead (``{"nll": -sum log p(token | before), "count": n - 1}``, `sequence_nll`), what our side's
held-out perplexity computes. An empty line ends it.
"""

from __future__ import annotations

import json
import sys
import time


def sequence_nll(scores, ids: list[int]) -> float:
    """``-sum_t log softmax(scores[t])[ids[t + 1]]`` in float64: the negative log-likelihood of ``ids`` after its first
    token, from the logits ``scores`` ``[len(ids), V]`` at every position."""
    import numpy as np

    s = np.asarray(scores[: len(ids) - 1], dtype=np.float64)
    s = s - s.max(axis=1, keepdims=True)
    logp = s - np.log(np.exp(s).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(ids) - 1), ids[1:]].sum())


def main() -> int:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    path, threads = sys.argv[1], int(sys.argv[2])
    common = {"model_path": path, "n_threads": threads, "n_threads_batch": threads, "n_ctx": 2048, "verbose": False}
    models = {"plain": llama_cpp.Llama(**common),
              "lookup": llama_cpp.Llama(**common, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=4)),
              "score": llama_cpp.Llama(**common, logits_all=True)}
    print(json.dumps({"ready": llama_cpp.__version__}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        req = json.loads(line)
        model = models[req["mode"]]
        model.reset()
        if req["mode"] == "score":
            model.eval(req["prompt"])
            print(json.dumps({"nll": sequence_nll(model.scores, req["prompt"]), "count": len(req["prompt"]) - 1}),
                  flush=True)
            continue
        model.set_seed(int(req.get("seed", 0)))
        start = time.perf_counter()
        first = None
        count = 0
        for _ in model.generate(req["prompt"], temp=1.0, top_k=0, top_p=1.0, min_p=0.0, reset=True):
            count += 1
            if first is None:
                first = time.perf_counter()
            if count >= req["tokens"]:
                break
        end = time.perf_counter()
        print(json.dumps({"tokens": count, "prefill_seconds": first - start, "decode_seconds": end - first}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
