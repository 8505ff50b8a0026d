"""Our autoregressive loop next to HF transformers' ``generate()`` on one model and device (`ar_vs_generate`),
for ``make gpu-smoke``.

Both decode the same chat prompt greedily, ``tokens`` new tokens (``generate`` with ``min_new_tokens`` so an EOS
does not end it early; our loop stops at no EOS). Per token: ``(t(tokens) - t(1)) / (tokens - 1)`` of whole calls
(the prefill and first token cancel), medians over ``rounds`` interleaved rounds, CUDA synchronized. The engine's
host overhead per step is our loop's time per token beyond ``generate()``'s: both run the same forward, so the
difference is the engine's own work (caches, positions, probability rows, the step's bookkeeping) minus HF's.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

PROMPT = "Write a short story about a lighthouse keeper."


def _seconds(fn, device) -> float:
    import torch

    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _decoders(folder: Path, device, dtype):
    """(prompt ids, {name: fn(n) decoding n tokens and returning them}) for our loop and ``generate()``."""
    import torch

    from decoding.sampling import Sampling
    from engine.decoder import AUTOREGRESSIVE, SpeculativeDecoder
    from models.loading import load_model, load_tokenizer

    spec = f"hf:{folder}"
    model, tok = load_model(spec, device, dtype), load_tokenizer(spec)
    enc = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                  tokenize=True, return_dict=False)
    prompt = [int(t) for t in enc]
    decoder = SpeculativeDecoder(model, None, model.get_output_embeddings().weight.shape[0])
    ids = torch.tensor([prompt], device=device)

    def ours(n: int) -> list[int]:
        return decoder.generate(prompt, n, AUTOREGRESSIVE, sampling=Sampling(0.0)).tokens

    def hf(n: int) -> list[int]:
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=tok.pad_token_id or tok.eos_token_id)
        return out[0, len(prompt):].tolist()

    return {"ours": ours, "generate": hf}


def ar_vs_generate(folder: Path, device, dtype, tokens: int = 32, rounds: int = 3) -> dict:
    """Tokens per second of our autoregressive loop and of ``generate()`` (see the module docstring)."""
    decoders = _decoders(folder, device, dtype)
    for fn in decoders.values():  # warm-up (kernels, caches, allocator)
        fn(tokens)
    per_token = {name: [] for name in decoders}
    for _ in range(rounds):
        for name, fn in decoders.items():
            full, one = _seconds(lambda fn=fn: fn(tokens), device), _seconds(lambda fn=fn: fn(1), device)
            per_token[name].append((full - one) / (tokens - 1))
    ms = {name: 1e3 * statistics.median(v) for name, v in per_token.items()}
    same = decoders["ours"](tokens) == decoders["generate"](tokens)
    return {"tokens": tokens, "rounds": rounds, "ours_ms_per_token": ms["ours"],
            "generate_ms_per_token": ms["generate"], "ours_tokens_per_second": 1e3 / ms["ours"],
            "generate_tokens_per_second": 1e3 / ms["generate"], "ours_over_generate_tps": ms["generate"] / ms["ours"],
            "engine_host_overhead_ms_per_step": ms["ours"] - ms["generate"], "same_tokens": same}
