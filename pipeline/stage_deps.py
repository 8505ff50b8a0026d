"""Check that each dvc stage's code deps (packages, written by hand in dvc.yaml) cover what the stage imports.

    python -m pipeline.stage_deps --check   # exit 1 and name each file a stage imports but does not list,
                                            # and each listed package it never imports
    python -m pipeline.stage_deps --table   # how many stages an edit of each package reruns

dvc.yaml lists a stage's code at package level (``decoding``, ``engine``, ``verifiers``, ...) and, in `pipeline/`,
the stage's own modules and the shared config (`pipeline/sections.py`). The packages are cut so that this is
narrow: the verifiers, the torch engine, the selector and the policies are packages of their own, so an edit of
one reruns only the stages that import it. A stage's command is ``branchpoint <subcommand>``: it runs `pipeline/cli.py`, which loads the params
sections the stage module names in ``SECTIONS`` (dataclasses of `pipeline/sections.py`) and runs the stage
module of `pipeline.cli.COMMANDS`. Its code deps are the project files reachable from those modules
by imports (an AST walk, imports inside functions included, ``if TYPE_CHECKING:`` blocks
excluded, package ``__init__`` files included, the lazy names of a package's ``_EXPORTS`` table
followed), plus the package data a reached module names (a string constant equal to a file or folder
next to it, e.g. ``"prompt_sets"``). The CLI imports the other stage modules only to register their
flags; those are not followed. Deps outside the project's packages (data/, artifacts/) are kept as
they are, after the code deps.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("decoding", "engine", "verifiers", "selector", "models", "data_collection", "evaluation", "export", "policies", "pipeline")
CLI_MODULE = "pipeline.cli"
_FILE_NAME = re.compile(r"[A-Za-z0-9_][\w.-]{0,99}")


def module_file(module: str, root: Path = ROOT) -> Path | None:
    """The project file of a dotted module name (``a/b.py`` or ``a/b/__init__.py``), None if not ours."""
    if module.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _walk(tree: ast.AST):
    """ast.walk without the bodies of ``if TYPE_CHECKING:`` (those imports never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if _is_type_checking(node):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _lazy_exports(tree: ast.Module) -> dict[str, str]:
    """A package's ``_EXPORTS = {"name": ".module", ...}`` table (PEP 562 lazy names)."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "_EXPORTS" and isinstance(node.value, ast.Dict)):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


def _resolve(base: str, level: int, package: str) -> str:
    if level == 0:
        return base
    parts = package.split(".")
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([base] if base else []))


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Dotted names of the project modules one file imports (submodules of ``from pkg import sub`` too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, package)
            found.add(base)
            init = module_file(base, root)
            lazy = _lazy_exports(ast.parse(init.read_text())) if init and init.name == "__init__.py" else {}
            for alias in node.names:
                if module_file(f"{base}.{alias.name}", root):
                    found.add(f"{base}.{alias.name}")
                elif alias.name in lazy:
                    found.add(_resolve(lazy[alias.name].lstrip("."), lazy[alias.name].count("."), base)
                              if lazy[alias.name].startswith(".") else lazy[alias.name])
    return {m for m in found if module_file(m, root)}


def _with_packages(module: str) -> list[str]:
    """``a.b.c`` runs ``a/__init__``, ``a/b/__init__`` and ``a/b/c``."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def package_data(path: Path) -> set[Path]:
    """Files or folders next to a module that it names by a string constant (non-Python package data)."""
    here = path.parent
    names = {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
             and isinstance(n.value, str) and _FILE_NAME.fullmatch(n.value)}
    return {here / n for n in names if (here / n).exists() and not n.endswith(".py") and n != "__pycache__"}


def code_deps(entries: list[str], root: Path = ROOT) -> list[str]:
    """Sorted repo-relative paths of every project file (and package data) reachable from ``entries``."""
    seen: dict[str, Path] = {}
    todo = [m for e in entries for m in _with_packages(e)]
    while todo:
        module = todo.pop()
        path = module_file(module, root)
        if module in seen or path is None:
            continue
        seen[module] = path
        for m in imported_modules(path, root):
            todo.extend(_with_packages(m))
    files = set(seen.values()) | {d for p in seen.values() for d in package_data(p)}
    return sorted(p.relative_to(root).as_posix() for p in files)


def declared_sections(module: str, root: Path = ROOT) -> list[str]:
    """The params sections a stage module loads: its ``SECTIONS = (...)`` (None = every section)."""
    from pipeline.sections import SECTION_CLASSES

    path = module_file(module, root)
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SECTIONS"]:
            value = ast.literal_eval(node.value)
            return list(SECTION_CLASSES) if value is None else list(value)
    raise SystemExit(f"{path}: a stage module must name the params sections it reads in SECTIONS")


def stage_entries(dvc: dict) -> dict[str, list[str]]:
    """Stage -> the modules its command runs (``pipeline.cli``, the subcommand's stage module and the params
    sections' dataclasses)."""
    from pipeline.cli import COMMANDS

    out = {}
    for stage, spec in dvc["stages"].items():
        words = str(spec["cmd"]).split()
        if words[:1] != ["branchpoint"] or len(words) < 2 or words[1] not in COMMANDS:
            raise SystemExit(f"stage {stage}: cmd {spec['cmd']!r} is not a `branchpoint <subcommand>`")
        module = COMMANDS[words[1]][0]
        out[stage] = [CLI_MODULE, module, "pipeline.sections"]
    return out


def _is_code(dep: str) -> bool:
    return dep.split("/")[0] in PACKAGES


def covers(dep: str, path: str) -> bool:
    """A dvc dep (a file or a folder) covers a path when it is that path or a folder above it."""
    return path == dep or path.startswith(dep.rstrip("/") + "/")


def differences(dvc: dict, root: Path = ROOT) -> list[str]:
    """One line per file a stage imports that none of its deps covers, and per code dep that covers none of the
    files it imports (a package listed but never read reruns the stage for nothing)."""
    lines = []
    for stage, entries in stage_entries(dvc).items():
        reached = code_deps(entries, root)
        listed = [d for d in dvc["stages"][stage].get("deps", []) if _is_code(d)]
        lines += [f"{stage}: imports {f}, which no dep covers" for f in reached
                  if not any(covers(d, f) for d in listed)]
        lines += [f"{stage}: lists {d}, which it never imports" for d in listed
                  if not any(covers(d, f) for f in reached)]
    return lines


def rerun_table(dvc: dict, areas: list[str]) -> dict[str, int]:
    """Area (a package, a folder or a file) -> number of stages an edit of a file in it reruns."""
    return {a: sum(any(covers(d, a) or covers(a, d) for d in s.get("deps", [])) for s in dvc["stages"].values())
            for a in areas}


AREAS = ["decoding", "decoding/pricing.py", "engine", "verifiers", "policies", "policies/lookup.py", "selector",
         "models", "data_collection", "evaluation", "export", "pipeline/config.py", "pipeline/sections.py",
         "pipeline/tracking.py", "pipeline/evaluate.py"]


def main(argv: list[str] | None = None) -> int:
    import yaml

    ap = argparse.ArgumentParser(prog="python -m pipeline.stage_deps", description=__doc__.splitlines()[0])
    ap.add_argument("--dvc-yaml", type=Path, default=ROOT / "dvc.yaml")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when dvc.yaml's code deps miss an import")
    mode.add_argument("--table", action="store_true", help="stages an edit of each package reruns")
    args = ap.parse_args(argv)
    dvc = yaml.safe_load(args.dvc_yaml.read_text())
    if args.table:
        for area, n in rerun_table(dvc, AREAS).items():
            print(f"{area:30s} {n}")
        return 0
    diff = differences(dvc)
    for line in diff:
        print(line)
    if diff:
        print("dvc.yaml's code deps do not match the stages' imports: edit the stage's `deps:` in dvc.yaml",
              file=sys.stderr)
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main())
