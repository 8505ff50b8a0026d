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
    parser.add_argument("--calibrate", action="store_true",
                        help="with --selector: correct the profile's step times online with this decode's measured "
                             "ones (decoding/calibration.py; the choices then depend on the machine's speed)")
    parser.add_argument("--lookup", type=int, default=0, metavar="N",
                        help="prompt lookup first: where the context's last tokens occurred earlier, verify the (up to N) "
                             "tokens that followed them, with no draft work (decoding/lookup.py); elsewhere the "
                             "selector, the static action or (with --method autoregressive) a plain step decides")
    parser.add_argument("--lookup-ngram", type=int, default=1, metavar="G",
                        help="with --lookup: the shortest suffix of the context that must have occurred before "
                             "(1-4, default %(default)s; longer suffixes are tried first)")
    parser.add_argument("--lookup-gate", metavar="FILE",
                        help="the learned lookup instead of --lookup's rule: verify the chain after the context's "
                             "longest earlier repeat where the gate (artifacts/lookup_gate.json, written by "
                             "`branchpoint lookup`) predicts more tokens per second than the selector's best (a "
                             "regression selector) or, without --selector, than a plain step (decoding/lookup_gate.py)")
    parser.add_argument("--json", metavar="FILE", help="also write the tokens, text and statistics to FILE")


def _pick(flag, default):
    return default if flag is None else flag


NO_TREE = "none"  # the method count of steps that drafted nothing (an autoregressive step inside the loop)


def steps_used(stats) -> dict:
    """What the steps actually used: ``{"methods": {method: steps}, "actions": {"K,L1,L2": steps}}``, most used
    first; steps whose action drafted no tree count under method ``"none"`` (no verification ran)."""
    methods = dict(stats.methods)
    no_tree = stats.steps - sum(methods.values())
    if no_tree:
        methods[NO_TREE] = no_tree
    order = lambda d: dict(sorted(d.items(), key=lambda kv: (-kv[1], kv[0])))  # noqa: E731
    return {"methods": order(methods), "actions": order(dict(stats.actions))}


def used_label(used: dict) -> str:
    """One line: ``methods specinfer 12, none 30; actions 1,0,0 30, 2,1,2 12`` (steps per method and action)."""
    fmt = lambda d: ", ".join(f"{k} {v}" for k, v in d.items()) or "-"  # noqa: E731
    return f"methods {fmt(used['methods'])}; actions {fmt(used['actions'])}"


def check_lookup(args) -> None:
    """``--lookup`` / ``--lookup-ngram`` in range, before anything is loaded."""
    from decoding.errors import UserInputError
    from decoding.lookup import MAX_NGRAM

    if args.lookup and getattr(args, "lookup_gate", None):
        raise UserInputError("--lookup (prompt lookup's rule) and --lookup-gate (the learned lookup) exclude each other")
    if args.lookup < 0 or not 1 <= args.lookup_ngram <= MAX_NGRAM:
        raise UserInputError(f"--lookup must be >= 0 (0 = off) and --lookup-ngram in [1, {MAX_NGRAM}], not "
                             f"{args.lookup} and {args.lookup_ngram}")


def check_inputs(cfg, args, draft_spec: str) -> None:
    """Fail before any model is loaded when a path the run needs is missing, naming the real problem."""
    from pathlib import Path

    from decoding.errors import UserInputError

    here = "" if Path(args.params).is_file() else (
        f" (there is no {args.params} in {Path.cwd()}: run decode from the project folder, or pass --params)")
    if args.calibrate and not args.selector:
        raise UserInputError("--calibrate corrects a selector's step times: it needs --selector")
    if args.selector:
        folder = Path(args.selector)
        if not folder.is_dir():
            raise UserInputError(f"--selector {folder}: no such folder{here}")
        if (folder / "selector.safetensors").is_file() and not (folder / "selector.onnx").is_file():
            raise UserInputError(f"--selector {folder} is the PyTorch checkpoint of stage train; decode uses the "
                                 "ONNX export: --selector artifacts/selector (written by `branchpoint export`)")
    for spec in (cfg.model.target, draft_spec):
        scheme, _, rest = spec.partition(":")
        if scheme == "self_draft" and not Path(rest).is_dir():
            raise UserInputError(f"draft {spec!r}: folder {rest} not found{here or ' (train it: branchpoint train-draft)'}")
        if scheme in ("hf", "gguf") and rest.startswith(("/", ".", "~")) and not Path(rest).expanduser().exists():
            raise UserInputError(f"model {spec!r}: {rest} not found (a local {'folder' if scheme == 'hf' else 'file'}"
                                 f" path){here}")


def run(cfg, args) -> int:
    import torch

    from data_collection.prompts import encode_prompt
    from decoding.actions import parse_action
    from decoding.engine import AUTOREGRESSIVE, SpeculativeDecoder
    from decoding.sampling import Sampling
    from decoding.verifiers import get_method
    from models.loading import eos_ids, load_pair

    check_lookup(args)
    method = _pick(args.method, cfg.decode.method)
    if method != AUTOREGRESSIVE:
        get_method(method)  # unknown names fail before any model is loaded
    action = parse_action(_pick(args.action, cfg.decode.action))
    policy = action
    if args.selector:
        from export.cascade import load_selector

        check_inputs(cfg, args, cfg.model.draft)
        policy = load_selector(args.selector, latency=args.latency, calibrate=args.calibrate)  # or a cascade
        if method == AUTOREGRESSIVE:
            method = policy.methods[0]
    if args.lookup:
        from decoding.lookup import MAX_NGRAM, LookupFirst

        fallback = None if method == AUTOREGRESSIVE else policy  # a plain step where nothing matched
        policy = LookupFirst(fallback, args.lookup, MAX_NGRAM, args.lookup_ngram, "naive")
        method = "naive" if method == AUTOREGRESSIVE else method
    if args.lookup_gate:
        policy, method = learned_lookup(args, policy, method)
    sampling = Sampling(_pick(args.temperature, cfg.sampling.temperature), _pick(args.top_p, cfg.sampling.top_p))
    max_new = _pick(args.max_new_tokens, cfg.decode.max_new_tokens)
    seed = _pick(args.seed, cfg.decode.seed)
    prompt = _pick(args.prompt, cfg.decode.prompt)

    no_draft = method == AUTOREGRESSIVE or not getattr(policy, "uses_draft_model", True)
    draft_spec = cfg.model.target if no_draft else cfg.model.draft
    check_inputs(cfg, args, draft_spec)
    torch.set_num_threads(cfg.model.threads)
    start = time.perf_counter()
    pair = load_pair(cfg.model.target, draft_spec, cfg.model.device, cfg.model.dtype, cfg.model.cache_dir,
                     cfg.model.device_map)
    load_s = time.perf_counter() - start
    ids = encode_prompt(prompt, pair.tokenizer, cfg.decode.chat_template and not args.no_chat_template)
    decoder = SpeculativeDecoder(pair.target, None if no_draft else pair.draft, pair.vocab_size,
                                 eos_ids(pair.tokenizer, pair.target))
    result = decoder.generate(ids, max_new, method, policy, sampling, seed)
    text = pair.tokenizer.decode(result.tokens, skip_special_tokens=True)
    used = steps_used(result.stats)
    if policy is not action:  # the selector chose each step's method: name what ran, not the default
        result.stats.method = "selector (" + ", ".join(m for m in used["methods"]) + ")"
    print(f"pair: target {pair.target_spec}, draft {'-' if no_draft else draft_spec}, "
          f"{pair.device}, {str(pair.dtype).replace('torch.', '')}, {torch.get_num_threads()} threads "
          f"(loaded in {load_s:.1f} s)")
    shape = "" if method == AUTOREGRESSIVE else f", action {action}" if policy is action else f", {policy}"
    print(f"prompt: {len(ids)} tokens; sampling T={sampling.temperature}, top_p={sampling.top_p}, seed {seed}{shape}")
    print("-" * 72)
    print(text)
    print("-" * 72)
    print(result.stats.summary())
    print(f"  steps used: {used_label(used)}")
    if getattr(policy, "calibration", None) is not None:
        print(f"  online calibration: {policy.calibration}")
    if args.json:
        _write_json(args.json, {"prompt": prompt, "prompt_tokens": ids, "tokens": result.tokens, "text": text,
                                "action": str(action) if policy is action else str(policy)}, sampling, result.stats)
    return 0


DEFAULT_LATENCY = "artifacts/latency.json"  # `branchpoint profile`'s output: prices the learned lookup's chains


def learned_lookup(args, policy, method: str) -> tuple[object, str]:
    """``(policy, method)`` with ``--lookup-gate``: `decoding.lookup_gate.LearnedLookup` over the selector (priced by
    its latency model) or, with ``--method autoregressive``, over a plain step (priced by ``--latency`` or
    `DEFAULT_LATENCY`)."""
    from pathlib import Path

    from decoding.engine import AUTOREGRESSIVE
    from decoding.errors import UserInputError
    from decoding.latency import LatencyModel
    from decoding.lookup_gate import LearnedLookup, LookupGate, LookupGateError

    try:
        gate = LookupGate.load(args.lookup_gate)
    except LookupGateError as e:
        raise UserInputError(str(e)) from None
    if args.selector:
        if not getattr(policy, "predicts_block_efficiency", False):  # a cascade, or a throughput selector
            raise UserInputError(f"--lookup-gate needs a regression selector (its predicted Ê / T is what a lookup "
                                 f"chain is weighed against); {args.selector} is not one")
        return LearnedLookup(gate, policy.latency, policy), method
    if method != AUTOREGRESSIVE:  # a static action has no predicted Ê / T to weigh a chain against
        raise UserInputError("--lookup-gate goes with --selector, or with --method autoregressive (the learned lookup "
                             "over plain steps)")
    path = args.latency or DEFAULT_LATENCY
    if not Path(path).is_file():
        raise UserInputError(f"--lookup-gate without --selector prices its chains with a latency profile: {path} not "
                             "found (run `branchpoint profile` or pass --latency FILE)")
    return LearnedLookup(gate, LatencyModel.load(path)), "naive"


def _write_json(path: str, run: dict, sampling, stats) -> None:
    """The run, its sampling and statistics, with the steps per method and action (`steps_used`), atomically."""
    from decoding.files import write_json_atomic

    used = steps_used(stats)
    write_json_atomic(path, {**run, "used": used,
                             "sampling": {"temperature": sampling.temperature, "top_p": sampling.top_p},
                             "stats": stats.to_dict() | {"methods": used["methods"], "actions": used["actions"]}},
                      sort_keys=False)
