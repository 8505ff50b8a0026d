"""params.yaml, generated from the config dataclasses (the one place defaults live).

    python -m pipeline.params_file --write   # regenerate params.yaml from pipeline/sections.py
    python -m pipeline.params_file --check   # exit 1 when the committed params.yaml differs

Each section is its dataclass's fields in order, with the default values and the comments written next to
the fields in the source (a comment line above a field, a trailing comment after it); the first line of
the class docstring heads the section. `tests/test_params_file.py` keeps params.yaml equal to the output.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import sys
import tokenize
from pathlib import Path

import yaml

from decoding.files import write_text_atomic
from pipeline.sections import SECTION_CLASSES, section_class

ROOT = Path(__file__).resolve().parents[1]
HEADER = ("# branchpoint parameters: one section per stage, generated from the dataclasses of\n"
          "# pipeline/sections.py (python -m pipeline.params_file --write; edit the defaults there, not here).\n"
          "# Override any value on the command line: branchpoint <command> --set section.key=value\n")


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on that line (without ``#``)."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def _value(value) -> str:
    """One YAML flow value (``null``, ``[1.0, 0.6]``, ``'2,2,3'``)."""
    text = yaml.safe_dump([value], default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text[1:-1]


def _section(name: str, cls: type, comments: dict[int, str], lines: list[str]) -> list[str]:
    """The lines of one section: docstring head, then each field with its source comments."""
    node = next(n for n in ast.walk(ast.parse("".join(lines))) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    doc = (ast.get_docstring(node) or "").strip().splitlines()
    out = [f"# {doc[0]}"] if doc else []
    out.append(f"{name}:")
    defaults = dataclasses.asdict(cls())
    fields = {n.target.id: n for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for key, value in defaults.items():
        field_node = fields[key]
        above, line = [], field_node.lineno - 1
        while line in comments and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, f"  # {comments[line]}")
            line -= 1
        trailing = comments.get(field_node.end_lineno)
        out += above + [f"  {key}: {_value(value)}" + (f"  # {trailing}" if trailing else "")]
    return out


def render_params() -> str:
    """The text of params.yaml: every section of `pipeline.sections.SECTION_CLASSES` with its defaults."""
    blocks = []
    for name in SECTION_CLASSES:
        cls = section_class(name)
        source_lines = inspect.getsourcelines(sys.modules[cls.__module__])[0]
        comments = _comments("".join(source_lines))
        blocks.append("\n".join(_section(name, cls, comments, source_lines)))
    return HEADER + "\n" + "\n\n".join(blocks) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.params_file", description=__doc__.splitlines()[0])
    ap.add_argument("--path", type=Path, default=ROOT / "params.yaml")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when the file differs from the defaults")
    mode.add_argument("--write", action="store_true", help="write the file from the defaults")
    args = ap.parse_args(argv)
    text = render_params()
    if args.write:
        write_text_atomic(args.path, text)
        return 0
    if not args.path.is_file() or args.path.read_text() != text:
        print(f"{args.path} differs from the defaults of pipeline/sections.py: run "
              "`python -m pipeline.params_file --write`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
