"""Counts of the code base from a plain script: ``python -m pipeline.info --layout`` (or ``branchpoint info --layout``).

- modules and lines per top-level package (`PACKAGES`);
- the functions with the most parameters in the source packages (`SOURCE_PACKAGES`: all but tests and benchmarks),
  ``self`` and ``cls`` not counted, ``*args`` / ``**kwargs`` counted once each;
- the number of imports inside functions (``import`` statements in a function body) in the source packages.

An AST walk of the files, nothing imported. The modules one default decoding step opens are not counted here:
`tests/test_decision_path.py` traces them (it needs a model pair and an exported selector) and
docs/architecture.md lists them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_PACKAGES = ("decoding", "verifiers", "engine", "models", "selector", "data_collection", "evaluation", "export",
                   "policies", "pipeline", "integrations")
PACKAGES = (*SOURCE_PACKAGES, "benchmarks", "tests")


@dataclass
class Layout:
    """What `layout` counts; ``widest``: (parameters, "file:line name") of the functions with the most."""

    modules: dict[str, int] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    widest: list[tuple[int, str]] = field(default_factory=list)
    local_imports: int = 0


def package_files(package: str, root: Path = ROOT) -> list[Path]:
    """The ``.py`` files of ``package`` (caches and virtual environments left out)."""
    return sorted(p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts)


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters of ``fn``, ``self`` / ``cls`` first not counted, ``*args`` and ``**kwargs`` one each."""
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args)]
    skip = 1 if names and names[0] in ("self", "cls") else 0
    return len(names) - skip + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def _local_imports(node: ast.AST, in_function: bool = False) -> int:
    """Import statements under ``node`` whose enclosing scope is a function."""
    inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
    own = int(in_function and isinstance(node, (ast.Import, ast.ImportFrom)))
    return own + sum(_local_imports(child, inside) for child in ast.iter_child_nodes(node))


def _scan(tree: ast.AST, rel: str, out: Layout) -> None:
    """Add the functions' parameter counts and the function-local imports of one parsed file to ``out``."""
    out.widest += [(parameter_count(node), f"{rel}:{node.lineno} {node.name}") for node in ast.walk(tree)
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    out.local_imports += _local_imports(tree)


def layout(root: Path = ROOT, top: int = 10) -> Layout:
    """Count modules, lines, the widest functions (``top`` of them) and the function-local imports under ``root``."""
    out = Layout()
    for package in PACKAGES:
        files = package_files(package, root)
        out.modules[package] = len(files)
        out.lines[package] = 0
        for path in files:
            text = path.read_text(encoding="utf-8")
            out.lines[package] += len(text.splitlines())
            if package in SOURCE_PACKAGES:
                _scan(ast.parse(text, filename=str(path)), str(path.relative_to(root)), out)
    out.widest = sorted(out.widest, key=lambda w: (-w[0], w[1]))[:top]
    return out


def format_layout(found: Layout) -> str:
    """The counts as plain text lines."""
    lines = [f"{'package':<16} {'modules':>7} {'lines':>7}"]
    lines += [f"{p:<16} {found.modules[p]:>7} {found.lines[p]:>7}" for p in PACKAGES]
    lines.append(f"{'total':<16} {sum(found.modules.values()):>7} {sum(found.lines.values()):>7}")
    lines.append(f"most parameters of a function (source packages): {found.widest[0][0] if found.widest else 0}")
    lines += [f"  {n:>3}  {where}" for n, where in found.widest]
    lines.append(f"function-local imports (source packages): {found.local_imports}")
    return "\n".join(lines)
