"""``branchpoint profile``: stage profile, the latency profile of the model pair on this machine.

Reads: params ``model.*`` (the pair, device, dtype, ``model.threads``), ``sampling.*`` (the row transform
that is timed with each forward), ``decode.prompt`` (the context tokens), ``profile.*`` (the grid), ``actions.*`` (the shapes whose verification
is timed per method) and ``train_draft.{layers, adapter_width, vocab_subset_size}``. Writes ``profile.out``
(artifacts/latency.json): the `decoding.latency.LatencyModel` tables, the cost of deciding's features, and the machine,
versions and settings they were measured with. Every later stage loads it with ``LatencyModel.load``.

The profile does not need the trained draft: when ``model.draft`` is ``self_draft:<folder>`` or ``eagle:<folder>``
and the folder holds no artifact of that kind yet, an untrained draft of that kind built from the ``train_draft``
config (same layers, adapter width, vocabulary subset size), packed like a loaded one, is timed instead. Its step time does not depend on the
weights (same shapes, same kernels), so the profile can run before, and independently of, train_draft.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

SECTIONS = ("model", "sampling", "decode", "train_draft", "actions", "profile")  # the params sections it loads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def load_profiled_pair(cfg):
    """``(pair, draft_source)``: the pair the decoder would load (`models.loading.LMPair`), or the target with an
    untrained draft of the configured shape when the artifact is not built yet, and which draft that is."""
    from models.loading import (
        LMPair,
        common_vocab_size,
        load_model,
        load_pair,
        load_tokenizer,
        parse_spec,
        resolve_device,
        resolve_dtype,
    )

    m = cfg.model
    scheme, folder = parse_spec(m.draft)
    if scheme not in ("self_draft", "eagle") or _artifact_kind(folder) == scheme:
        return load_pair(m.target, m.draft, m.device, m.dtype, m.cache_dir, m.placement()), m.draft
    from models.fast_path import prepare_for_inference
    from models.self_draft import SelfDraft, SelfDraftConfig, target_fingerprint

    td = cfg.train_draft
    tokenizer = load_tokenizer(m.target, m.cache_dir)
    device, dtype = resolve_device(m.device), resolve_dtype(m.dtype)
    target = load_model(m.target, device, dtype, m.cache_dir, m.placement())
    if scheme == "eagle":  # same shapes, same cost
        from models.eagle_draft import EagleDraft, EagleDraftConfig, for_inference

        draft = for_inference(EagleDraft(target, EagleDraftConfig(td.adapter_width, td.vocab_subset_size,
                                                                  target_fingerprint=target_fingerprint(target))))
        shape = f"adapter_width {td.adapter_width}"
    else:
        config = SelfDraftConfig(layers=td.layers, adapter_width=td.adapter_width,
                                 vocab_subset_size=td.vocab_subset_size,
                                 target_fingerprint=target_fingerprint(target))
        draft = prepare_for_inference(SelfDraft(target, config).eval())
        shape = f"layers {td.layers}, adapter_width {td.adapter_width}"
    source = (f"untrained {scheme} (train_draft config: {shape}, vocab_subset_size {td.vocab_subset_size}); "
              f"{folder} not built yet")
    vocab = common_vocab_size(target, draft, tokenizer)
    return LMPair(target, draft, tokenizer, vocab, device, dtype, m.target, m.draft), source


def _artifact_kind(folder: str) -> str | None:
    """The kind of the trained draft artifact in ``folder`` (None when there is none: not built yet, or a marker)."""
    import json

    config = Path(folder) / "config.json"
    if not config.is_file():
        return None
    try:
        return json.loads(config.read_text()).get("kind", "self_draft")
    except json.JSONDecodeError:
        return None


POOL_POSITIONS = 32  # positions whose draft / target rows build the timed verification trees


def pair_rows(target, draft, vocab: int, ids: list[int], sampling) -> tuple:
    """``(q_pool, p_pool)``: ``[POOL_POSITIONS, V]`` draft and target probability rows at the last positions of one
    forward of each model over ``ids`` (the trees `measure_verify_seconds` times)."""
    import torch

    from engine.torch_sampling import prob_rows

    device = next(target.parameters()).device
    x = torch.tensor([ids], device=device)
    with torch.inference_mode():
        rows = [prob_rows(m(input_ids=x).logits[0, -POOL_POSITIONS:], sampling, vocab) for m in (draft, target)]
    return rows[0], rows[1]


def run(cfg, args) -> int:
    import torch

    from data_collection.forward_tables import Grid, TimedPair, profile_pair, tile_ids
    from data_collection.prompts import encode_prompt
    from data_collection.step_prices import PriceRounds, measure_step_ratios, time_deciding
    from data_collection.verify_cost import measure_verify_seconds
    from decoding.sampling import Sampling
    from models.quantized import backend_of

    p = cfg.profile
    torch.set_num_threads(cfg.model.threads)
    start = time.perf_counter()
    loaded, draft_source = load_profiled_pair(cfg)
    target, draft, vocab, tokenizer = loaded.target, loaded.draft, loaded.vocab_size, loaded.tokenizer
    load_s = time.perf_counter() - start
    ids = tile_ids(encode_prompt(cfg.decode.prompt, tokenizer, cfg.decode.chat_template), max(p.contexts))
    meta = {"target": cfg.model.target, "draft": cfg.model.draft, "draft_timed": draft_source,
            "dtype": cfg.model.dtype, "backend": backend_of(target),
            "settings": {"threads_requested": cfg.model.threads, "context_tokens": "decode.prompt, tiled"}}
    sampling = Sampling(cfg.sampling.temperature, cfg.sampling.top_p)
    pair = TimedPair(target, draft, vocab)
    grid = Grid(p.contexts, p.draft_rows, p.target_tokens, p.repeats, p.warmup, sampling)
    model = profile_pair(pair, ids, grid, None if args.no_progress else "profile", meta)
    model = dataclasses.replace(model, feature_seconds=time_deciding(pair, ids, model, sampling, p.feature_repeats))
    if p.price_rounds:  # whole engine steps as ratios to plain steps of the same rounds (decoding/pricing.py)
        plan = PriceRounds(p.lookup_lengths, p.price_tokens, p.price_rounds, sampling)
        ratios, by_class = measure_step_ratios(pair, [tile_ids(ids, c) for c in p.price_contexts], model,
                                               list(cfg.actions.space()), plan,
                                               None if args.no_progress else "step prices")
        model = dataclasses.replace(model, step_ratios=ratios, meta={**model.meta, "step_ratios_by_class": by_class})
    if p.verify_repeats:  # each method's verify call per shape, on trees of the pair's own rows
        q_pool, p_pool = pair_rows(target, draft, vocab, ids[: min(p.contexts[-1], 256)], sampling)
        verify = measure_verify_seconds(list(cfg.actions.space()), q_pool, p_pool, repeats=p.verify_repeats,
                                        progress=None if args.no_progress else "verify")
        model = dataclasses.replace(model, verify_seconds=verify)
    model.save(p.out)
    print(f"pair: target {cfg.model.target}, draft {draft_source} (loaded in {load_s:.1f} s); "
          f"{model.meta['device']}, {model.meta['threads']} threads")
    ci = min(range(len(p.contexts)), key=lambda i: abs(p.contexts[i] - 256))
    c = p.contexts[ci]
    print(f"at context {c}: target pass (ms) " + ", ".join(
        f"n={n} {model.t_p(c, n) * 1e3:.1f}" for n in p.target_tokens if n in (1, 2, 4, 8, 16, 32)))
    print(f"at context {c}: draft step (ms) " + ", ".join(
        f"rows={r} {model.t_q(c, r) * 1e3:.1f}" for r in p.draft_rows))
    sr = model.step_ratios
    by_class = model.meta.get("step_ratios_by_class", {})
    shown = [k for k in ("traversal:2,0,1", "traversal:3,0,1", "traversal:1,2,0", "traversal:2,2,3", "lookup:4")
             if k in by_class]
    print(f"whole steps over a plain step ({sr.plain_scale:.2f}x the tables' one-token pass); fitted tree "
          f"{_terms(sr.tree)}, lookup chain {_terms(sr.chain)}"
          + ("; measured / fitted " + ", ".join(f"{k.split(':')[1]} {by_class[k]['ratio']:.2f} / "
                                                f"{by_class[k]['fitted_ratio']:.2f}" for k in shown) if shown else ""))
    if model.verify_seconds:
        shown = [a for a in ("2,0,1", "3,0,1", "1,1,0", "2,1,2") if a in model.verify_seconds.get("traversal", {})]
        print("verification (ms): " + "; ".join(
            f"{m} " + ", ".join(f"{a} {by[a] * 1e3:.2f}" for a in shown if a in by)
            for m, by in model.verify_seconds.items()))
    print("deciding's features (ms): " + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in model.feature_seconds.items())
          + f"; profile written to {p.out} "
          f"in {time.perf_counter() - start:.0f} s")
    return 0


def _terms(coefficients: dict) -> str:
    return " + ".join(f"{v:.3f} {k}" for k, v in coefficients.items())
