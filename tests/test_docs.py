"""The docs describe today's code: every command, flag, module, path and name they write in code exists.

For README.md, docs/*.md and configs/README.md (docs/history/ is exempt: it is dated history), in code (inline
backtick spans and fenced blocks):
- ``branchpoint <subcommand>``: the subcommand is in the CLI (`pipeline.cli.build_parser`), and each ``--flag``
  written after it is an option of that subcommand's parser;
- ``python -m <module> [subcommand]``: the module is importable and runs something (``__main__``); its flags (and subcommand) are those of the
  argparse parser its ``__main__`` builds (captured when it parses, so nothing runs), and a module that builds
  none takes no flags;
- a path of ours to a module, a doc or a folder (``decoding/pricing.py``, ``docs/throughput.md``, ``engine/``)
  exists (outputs such as ``benchmarks/results/engine.json`` are made by commands, and not checked);
- a dotted name of ours in an inline span (``decoding.pricing``, ``decoding.pricing.decide``,
  ``export.runtime.SelectorRuntime.select``) is a module, and what follows it its attributes (read from the
  module's AST, imported only where the AST does not say).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import importlib.util
import re
import runpy
import sys
import warnings
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("decoding", "models", "data_collection", "evaluation", "export", "policies", "pipeline", "integrations", "benchmarks",
        "tests", "configs", "docs")
DOCS = sorted([ROOT / "README.md", ROOT / "configs" / "README.md", *(ROOT / "docs").glob("*.md")])
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_INLINE = re.compile(r"`([^`\n]+)`")
_COMMAND = re.compile(r"(?:\bbranchpoint|\bpython -m)\s+([\w.-]+)([^|;&#]*)")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
_PATH = re.compile(rf"(?<![\w/.-])((?:{'|'.join(OURS)})(?:/[\w.-]+)+/?)")
_SHORT = re.compile(r"(?<![\w/.-])([A-Za-z_]\w*)((?:\.[A-Za-z_]\w*)+)(?![\w/-])")
_EXTENSIONS = {"json", "yaml", "yml", "py", "md", "onnx", "png", "parquet", "safetensors", "txt", "csv", "gguf", "lock",
               "toml", "cfg", "pt", "bin", "jsonl"}
# deliberate mentions of removed names in docs others own (docs/engine.md: why the draft is fp32)
HISTORIC = {"SelfDraft.quantize_", "train_draft.int8"}
_DOTTED = re.compile(rf"(?<![\w/.-])((?:{'|'.join(OURS[:-2])})(?:\.[A-Za-z_]\w*)+)(?![\w/-])")


def code_spans(text: str) -> tuple[list[str], list[str]]:
    """(lines of fenced blocks, inline backtick spans outside them)."""
    fenced = [line for block in _FENCE.findall(text) for line in block.splitlines()[1:-1]]
    return fenced, _INLINE.findall(_FENCE.sub("", text))


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


@cache
def module_parser(module: str) -> argparse.ArgumentParser | None:
    """The parser ``python -m module`` builds, captured at its first parse (None: the module builds none)."""
    if module == "pipeline.cli":
        from pipeline.cli import build_parser

        return build_parser()
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or "ArgumentParser(" not in Path(spec.origin).read_text(encoding="utf-8"):
        return None

    def capture(self, *args, **kwargs):
        raise _Parsed(self)

    saved = (argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args, sys.argv)
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = capture
    sys.argv = [module]
    try:
        with warnings.catch_warnings():  # runpy warns when the module was imported already
            warnings.simplefilter("ignore", RuntimeWarning)
            runpy.run_module(module, run_name="__main__", alter_sys=False)
    except _Parsed as parsed:
        return parsed.parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args, sys.argv = saved
    return None


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def command_problems(module: str, rest: str) -> list[str]:
    """What is wrong with ``python -m module rest`` (``pipeline.cli`` for ``branchpoint``) as a doc writes it."""
    spec = importlib.util.find_spec(module)
    if spec is None:
        return [f"python -m {module}: no such module"]
    main = Path(spec.origin).parent / "__main__.py" if spec.submodule_search_locations else Path(spec.origin)
    if module != "pipeline.cli" and "__main__" not in main.read_text(encoding="utf-8"):
        return [f"python -m {module}: runs nothing (no __main__)"]
    parser = module_parser(module)
    flags = _FLAG.findall(rest)
    if parser is None:
        return [f"{module}: takes no flags, the doc writes {flag}" for flag in flags]
    words = rest.split()
    subs, options = _subparsers(parser), _options(parser)
    if subs and words and not words[0].startswith(("-", "<", "[")):
        for name in words[0].strip("`.,():").split("|"):
            if name not in subs:
                return [f"{module}: no subcommand {name!r} (known: {', '.join(subs)})"]
            options |= _options(subs[name])
    return [f"{module} {words[0] if subs else ''}: no flag {flag}".replace("  ", " ") for flag in flags
            if flag not in options]


def _top_names(path: Path) -> dict[str, ast.AST]:
    """Names bound at the top of a module (defs, classes, assignments, imports, a lazy ``_EXPORTS`` table)."""
    names: dict[str, ast.AST] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        for target in getattr(node, "targets", [getattr(node, "target", None)]):
            if isinstance(target, ast.Name):
                names[target.id] = node
                if target.id == "_EXPORTS" and isinstance(node.value, ast.Dict):
                    names.update({k.value: node for k in node.value.keys if isinstance(k, ast.Constant)})
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
    return names


def _module_path(parts: list[str], root: Path) -> Path | None:
    base = root.joinpath(*parts)
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def _class_names(node: ast.ClassDef) -> set[str]:
    """Names a class body binds (methods, nested classes, fields)."""
    names = {getattr(n, "name", None) for n in node.body}
    names |= {getattr(t, "id", None) for n in node.body for t in [*getattr(n, "targets", []), getattr(n, "target", None)]}
    return names - {None}


def _has_attributes(module: str, path: Path, attrs: list[str]) -> bool:
    node = _top_names(path).get(attrs[0])
    if node is not None and (len(attrs) == 1 or (isinstance(node, ast.ClassDef) and len(attrs) == 2
                                                 and attrs[1] in _class_names(node))):
        return True
    try:  # what the AST does not show (inherited methods, names made at import)
        obj = importlib.import_module(module)
        for attr in attrs:
            obj = getattr(obj, attr)
        return True
    except (ImportError, AttributeError):
        return False


def dotted_problem(name: str, root: Path = ROOT) -> str | None:
    """None when ``name`` is a module of ours followed by attributes it has."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        path = _module_path(parts[:cut], root)
        if path is not None:
            if cut == len(parts) or _has_attributes(".".join(parts[:cut]), path, parts[cut:]):
                return None
            return f"{name}: {'.'.join(parts[:cut])} has no {'.'.join(parts[cut:])}"
    return f"{name}: no such module"


@cache
def short_names(root: Path = ROOT) -> dict[str, str]:
    """Dotted names of the modules and top-level classes of ours a doc may write short: a module by its file name
    (``pricing`` -> ``decoding.pricing``), a class by its name (``LatencyModel`` -> ``decoding.latency.LatencyModel``);
    only the names that are unique in the tree."""
    seen: dict[str, set[str]] = {}
    for package in OURS[:-3]:  # the source packages and benchmarks
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            if path.parent.name != "sections":  # section.key is a params key (config_key_problem)
                seen.setdefault(path.stem, set()).add(module)
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef):
                    seen.setdefault(node.name, set()).add(f"{module}.{node.name}")
    return {name: next(iter(full)) for name, full in seen.items() if len(full) == 1 and not name.startswith("_")}


def config_key_problem(name: str) -> str | None:
    """None when ``name`` (``section.key``) is a key of a params.yaml section; else what is wrong."""
    from pipeline.sections import SECTION_CLASSES, section_class

    section, key = (name.split(".") + [""])[:2]
    if section not in SECTION_CLASSES:
        return f"{name}: no params section {section!r}"
    fields = {f.name for f in dataclasses.fields(section_class(section))}
    return None if key in fields else f"{name}: section {section} has no key {key!r}"


def short_problems(span: str, root: Path = ROOT) -> list[str]:
    """Names written short in an inline span: a params key ``section.key``, or ``module.name`` / ``Class.name``
    resolved by `short_names`."""
    from pipeline.sections import SECTION_CLASSES

    names, problems = short_names(root), []
    for head, tail in _SHORT.findall(span):
        name = head + tail
        if name in HISTORIC or tail.rsplit(".", 1)[-1] in _EXTENSIONS or head in OURS:
            continue
        if head in SECTION_CLASSES:
            problem = config_key_problem(name)
        else:
            problem = dotted_problem(names[head] + tail, root) if head in names else None
        if problem:
            problems.append(problem if problem.startswith(name) else f"{name} ({problem})")
    return problems


def doc_problems(text: str, root: Path = ROOT) -> list[str]:
    """Every stale command, flag, path and name in a Markdown text (see the module docstring)."""
    fenced, inline = code_spans(text)
    problems = []
    for span in [*fenced, *inline]:
        for command in _COMMAND.finditer(span):
            is_cli = command.group(0).startswith("branchpoint")
            module, rest = ("pipeline.cli", command.group(1) + command.group(2)) if is_cli else command.groups()
            if not module.startswith("<"):
                problems += [p.replace("pipeline.cli", "branchpoint") for p in command_problems(module, rest)]
        for path in _PATH.findall(span):
            checked = path.endswith((".py", ".md", "/")) or "." not in path.rsplit("/", 1)[-1]
            if checked and not any(c in path for c in "<>*{}") and not (root / path).exists():
                problems.append(f"{path}: no such file")
    for span in inline:
        problems += [p for name in _DOTTED.findall(span)
                     if (p := dotted_problem(name, root)) and config_key_problem(name) and name not in HISTORIC]
        problems += short_problems(span, root)
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_docs_name_only_what_exists(doc: Path) -> None:
    problems = doc_problems(doc.read_text(encoding="utf-8"))
    assert not problems, f"{doc.relative_to(ROOT)} is stale:\n" + "\n".join(problems)


@pytest.mark.parametrize(("snippet", "stale"), [
    ("run `branchpoint decode --lookup-gate`", "no flag --lookup-gate"),
    ("```\nbranchpoint decode --calibrate --set decode.max_new_tokens=8\n```", "no flag --calibrate"),
    ("`branchpoint distil`", "no subcommand 'distil'"),
    ("`python -m pipeline.study cascade`", "no subcommand 'cascade'"),
    ("`python -m pipeline.study objectives --margin 0.1`", "no flag --margin"),
    ("`python -m pipeline.stage_deps --rewrite`", "no flag --rewrite"),
    ("`python -m pipeline.nothing`", "no such module"),
    ("`python -m decoding.pricing`", "runs nothing"),
    ("see `decoding/cascade.py`", "no such file"),
    ("see `docs/history/selector-notebook2.md`", "no such file"),
    ("`decoding.latency.LatencyModel.verify_offset`", "has no"),
    ("`decoding.pricing.output_seconds_at`", "has no output_seconds_at"),
    ("`decoding.cascade`", "decoding has no cascade"),
    ("`LatencyModel.verify_offset`", "verify_offset"),
    ("`branchpoint decode --set decode.lookup_gate=true`", "section decode has no key 'lookup_gate'"),
    ("`train.cascade`", "section train has no key 'cascade'"),
    ("`pricing.output_seconds_at`", "has no output_seconds_at"),
])
def test_the_checker_finds_a_planted_stale_name(snippet: str, stale: str) -> None:
    problems = doc_problems(f"Some text.\n\n{snippet}\n")
    assert any(stale in p for p in problems), problems


def test_the_checker_passes_names_that_exist() -> None:
    text = ("`branchpoint decode --set decode.max_new_tokens=8`, `branchpoint info --layout`, "
            "`python -m pipeline.study learning-curve|objectives --seeds 0 1`, `python -m pipeline.info --layout`, "
            "`decoding/pricing.py`, `decoding.pricing.decide`, `decoding.METHODS`, "
            "`export.runtime.SelectorRuntime.select`, `verifiers/`, `pricing.decide`, "
            "`StepRatios.plain_scale`, `latency.json`, `train.objective`, `export.out`")
    assert doc_problems(text) == []
