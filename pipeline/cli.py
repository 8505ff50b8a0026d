"""The ``branchpoint`` command line: one subcommand per stage.

Each subcommand lives in its own module exposing ``SECTIONS`` (the params sections it reads: only those are
loaded and validated), ``add_arguments(parser)`` and ``run(cfg, args) -> int`` (modules keep heavy imports
inside ``run`` so ``--help`` stays fast). Every subcommand takes
``--params FILE`` and repeatable ``--set section.key=value`` overrides. Errors caused by the user's input
(`decoding.errors.UserInputError`) print one line and exit with status 2; ``--verbose`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# subcommand -> (module, one-line help)
COMMANDS = {
    "info": ("pipeline.info", "print the resolved config, versions, device and the loaded model pair"),
    "decode": ("pipeline.decode", "speculatively decode one prompt and print the text and statistics"),
    "trajectories": ("pipeline.trajectories", "sample target continuations of every prompt once (stage trajectories)"),
    "train-draft": ("pipeline.train_draft", "train the draft of the target: an EAGLE head or a self-draft adapter (stage train_draft)"),
    "profile": ("pipeline.profile", "time draft steps and target tree passes on this machine (stage profile)"),
    "collect": ("pipeline.collect", "features + measured block efficiency at every root of the trajectories "
                                    "(stage collect)"),
    "train": ("pipeline.train", "train the branching-point selector on the collected dataset (stage train)"),
    "export": ("pipeline.export", "export the trained selector to ONNX + sidecar, check parity, register it "
                                  "(stage export)"),
    "chain-selector": ("pipeline.chain_selector", "train and export the chain selector: how many tokens to draft in "
                                                  "one chain, for runtimes such as HF transformers (stage "
                                                  "chain_selector)"),
    "evaluate": ("pipeline.evaluate", "decode TEST prompts with every policy end to end; report, plots and findings "
                                      "(stage evaluate)"),
    "publish": ("pipeline.publish", "push the DVC outputs, save this run as experiment 'main', register a selector "
                                    "version (after dvc repro; make main runs it)"),
    "headline": ("pipeline.headline", "the dozen headline numbers of a run in metrics/headline.json (stage headline)"),
}


def user_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input (config, files, models, prompt sets, datasets, features): printed as one
    line. Any other exception, a plain ``ValueError`` included, is a bug and keeps its traceback."""
    from decoding.errors import UserInputError

    return (UserInputError, FileNotFoundError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="branchpoint",
        description="Learn where to branch a speculative-decoding draft tree: collect features and labels, "
        "train an efficiency-regressing selector, export it to ONNX, decode with it.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
        p.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="SECTION.KEY=VALUE",
            help="override a params value, e.g. --set decode.max_new_tokens=32 (repeatable)",
        )
        p.add_argument("-v", "--verbose", action="store_true", help="show full tracebacks on errors")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            p.set_defaults(_module=None)
            continue
        module.add_arguments(p)
        p.set_defaults(_module=module_name)
    return parser


def use_project_caches() -> None:
    """numba's ``cache=True`` files go to .cache/numba (git- and dvc-ignored), not next to the sources in
    the packages' __pycache__ folders. Call before anything imports numba; NUMBA_CACHE_DIR, when set, wins."""
    os.environ.setdefault("NUMBA_CACHE_DIR", os.path.abspath(os.path.join(".cache", "numba")))


def main(argv: list[str] | None = None) -> int:
    import pipeline  # noqa: F401 - PROCESS_START_MS: when the stage started (its MLflow run's start)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub unless the user asks
    use_project_caches()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args._module is None:
        parser.error(f"'{args.command}' is not available in this build")
    from pipeline.config import load_config

    module = importlib.import_module(args._module)
    try:
        cfg = load_config(args.params if os.path.exists(args.params) or args.params != "params.yaml" else None,
                          args.overrides, sections=module.SECTIONS)
        return module.run(cfg, args) or 0
    except user_error_types() as e:
        if args.verbose:
            raise
        print(f"branchpoint {args.command}: error: {e}", file=sys.stderr)
        print("(run with --verbose for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
