"""``branchpoint decode``: speculatively decode one prompt and print the text and the run statistics.

Reads the ``model``, ``sampling`` and ``decode`` sections; the flags below override them for one run
(e.g. ``branchpoint decode --prompt "Hi" --method traversal --action 4,2,3``). ``--method
autoregressive`` samples from the target alone through the same loop (the baseline; no draft loaded).
"""

from __future__ import annotations

import argparse
import time

SECTIONS = ("model", "sampling", "decode")  # the params sections it loads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", help="prompt text (default: decode.prompt)")
    parser.add_argument("--method", help="verification method or 'autoregressive' (default: decode.method)")
    parser.add_argument("--action", help="static action K,L1,L2, e.g. 4,2,3 (default: decode.action)")
    parser.add_argument("--max-new-tokens", type=int, help="default: decode.max_new_tokens")
    parser.add_argument("--temperature", type=float, help="0 = greedy (default: sampling.temperature)")
    parser.add_argument("--top-p", type=float, help="default: sampling.top_p")
    parser.add_argument("--seed", type=int, help="default: decode.seed")
    parser.add_argument("--no-chat-template", action="store_true", help="feed the prompt text as is")
    parser.add_argument("--selector", metavar="FOLDER",
                        help="choose the action (and, for method auto, the method) of every step with an exported "
                             "selector (e.g. artifacts/selector, written by `branchpoint export`)")
    parser.add_argument("--latency", metavar="FILE",
                        help="with --selector: price actions with this latency profile (`branchpoint profile` on "
                             "this machine) instead of the one the selector was trained with")
    parser.add_argument("--lookup", type=int, default=0, metavar="N",
                        help="prompt lookup first: where the context's last tokens occurred earlier, verify the (up to N) "
                             "tokens that followed them, with no draft work (policies/lookup.py); elsewhere the "
                             "selector, the static action or (with --method autoregressive) a plain step decides")
    parser.add_argument("--lookup-ngram", type=int, default=1, metavar="G",
                        help="with --lookup: the shortest suffix of the context that must have occurred before "
                             "(1-4, default %(default)s; longer suffixes are tried first)")
    parser.add_argument("--json", metavar="FILE", help="also write the tokens, text and statistics to FILE")


def _pick(flag, default):
    return default if flag is None else flag


def steps_used(stats) -> dict[str, int]:
    """Steps per step class (`decoding.pricing.step_class`: ``plain``, ``lookup:n``, ``<method>:K,L1,L2``), most
    used first."""
    return dict(sorted(stats.classes.items(), key=lambda kv: (-kv[1], kv[0])))


def used_label(used: dict[str, int]) -> str:
    """One line: ``plain 30, specinfer:2,1,2 12``."""
    return ", ".join(f"{k} {v}" for k, v in used.items()) or "-"


def check_lookup(args) -> None:
    """``--lookup`` / ``--lookup-ngram`` in range, before anything is loaded."""
    from decoding.errors import UserInputError
    from policies.lookup import MAX_NGRAM

    if args.lookup < 0 or not 1 <= args.lookup_ngram <= MAX_NGRAM:
        raise UserInputError(f"--lookup must be >= 0 (0 = off) and --lookup-ngram in [1, {MAX_NGRAM}], not "
                             f"{args.lookup} and {args.lookup_ngram}")


def check_inputs(cfg, args, draft_spec: str) -> None:
    """Fail before any model is loaded when a path the run needs is missing, naming the real problem."""
    from pathlib import Path

    from decoding.errors import UserInputError

    here = "" if Path(args.params).is_file() else (
        f" (there is no {args.params} in {Path.cwd()}: run decode from the project folder, or pass --params)")
    if args.selector:
        folder = Path(args.selector)
        if not folder.is_dir():
            raise UserInputError(f"--selector {folder}: no such folder{here}")
        if (folder / "selector.safetensors").is_file() and not (folder / "selector.onnx").is_file():
            raise UserInputError(f"--selector {folder} is the PyTorch checkpoint of stage train; decode uses the "
                                 "ONNX export: --selector artifacts/selector (written by `branchpoint export`)")
    for spec in (cfg.model.target, draft_spec):
        scheme, _, rest = spec.partition(":")
        if scheme in ("self_draft", "eagle") and not Path(rest).is_dir():
            raise UserInputError(f"draft {spec!r}: folder {rest} not found{here or ' (train it: branchpoint train-draft)'}")
        if scheme in ("hf", "gguf") and rest.startswith(("/", ".", "~")) and not Path(rest).expanduser().exists():
            raise UserInputError(f"model {spec!r}: {rest} not found (a local {'folder' if scheme == 'hf' else 'file'}"
                                 f" path){here}")


def build(cfg, args):
    """``(policy, method, action)``: the run's policy from the registry (`policies.registry.build_policy`): the static
    action, or the selector; behind prompt lookup with ``--lookup``."""
    from decoding.actions import AUTOREGRESSIVE, parse_action
    from policies.registry import build_policy
    from verifiers import get_method

    check_lookup(args)
    method = _pick(args.method, cfg.decode.method)
    if method != AUTOREGRESSIVE:
        get_method(method)  # unknown names fail before any model is loaded
    action = parse_action(_pick(args.action, cfg.decode.action))
    if args.selector:
        check_inputs(cfg, args, cfg.model.draft)
        spec = {"name": "selector", "folder": args.selector, "latency": args.latency}
    elif method == AUTOREGRESSIVE:
        spec = {"name": AUTOREGRESSIVE}
    else:
        spec = {"name": "static", "action": str(action), "method": method}
    if args.lookup:
        spec = {"name": "prompt_lookup", "length": args.lookup, "min_ngram": args.lookup_ngram,
                "fallback": None if spec["name"] == AUTOREGRESSIVE else spec}
    built = build_policy(spec["name"], spec)
    return built.policy, built.method, action


def run(cfg, args) -> int:
    import torch

    from data_collection.prompts import encode_prompt
    from decoding.sampling import Sampling
    from engine.decoder import AUTOREGRESSIVE, SpeculativeDecoder
    from models.loading import eos_ids, load_pair

    policy, method, action = build(cfg, args)
    sampling = Sampling(_pick(args.temperature, cfg.sampling.temperature), _pick(args.top_p, cfg.sampling.top_p))
    max_new = _pick(args.max_new_tokens, cfg.decode.max_new_tokens)
    seed = _pick(args.seed, cfg.decode.seed)
    prompt = _pick(args.prompt, cfg.decode.prompt)
    no_draft = method == AUTOREGRESSIVE or not policy.uses_draft_model
    draft_spec = cfg.model.target if no_draft else cfg.model.draft
    check_inputs(cfg, args, draft_spec)
    torch.set_num_threads(cfg.model.threads)
    start = time.perf_counter()
    pair = load_pair(cfg.model.target, draft_spec, cfg.model.device, cfg.model.dtype, cfg.model.cache_dir,
                     cfg.model.placement())
    load_s = time.perf_counter() - start
    ids = encode_prompt(prompt, pair.tokenizer, cfg.decode.chat_template and not args.no_chat_template)
    decoder = SpeculativeDecoder(pair.target, None if no_draft else pair.draft, pair.vocab_size,
                                 eos_ids(pair.tokenizer, pair.target))
    result = decoder.generate(ids, max_new, method, policy, sampling, seed)
    text = pair.tokenizer.decode(result.tokens, skip_special_tokens=True)
    used = steps_used(result.stats)
    static = policy.fixed_action is not None
    if not static:  # the policy chose each step's method: name what ran, not the default
        result.stats.method = "selector (" + ", ".join(dict.fromkeys(k.split(":")[0] for k in used)) + ")"
    print(f"pair: target {pair.target_spec}, draft {'-' if no_draft else draft_spec}, "
          f"{pair.device}, {str(pair.dtype).replace('torch.', '')}, {torch.get_num_threads()} threads "
          f"(loaded in {load_s:.1f} s)")
    shape = "" if method == AUTOREGRESSIVE else f", action {action}" if static else f", {policy}"
    print(f"prompt: {len(ids)} tokens; sampling T={sampling.temperature}, top_p={sampling.top_p}, seed {seed}{shape}")
    print("-" * 72)
    print(text)
    print("-" * 72)
    print(result.stats.summary())
    print(f"  steps used: {used_label(used)}")
    if args.json:
        _write_json(args.json, {"prompt": prompt, "prompt_tokens": ids, "tokens": result.tokens, "text": text,
                                "action": str(action) if static else str(policy)}, sampling, result.stats)
    return 0


def _write_json(path: str, run: dict, sampling, stats) -> None:
    """The run, its sampling and statistics, with the steps per step class (`steps_used`), atomically."""
    from decoding.files import write_json_atomic

    write_json_atomic(path, {**run, "used": steps_used(stats),
                             "sampling": {"temperature": sampling.temperature, "top_p": sampling.top_p},
                             "stats": stats.to_dict()}, sort_keys=False)
