"""`pipeline/layout.py` (``python -m pipeline.info --layout``) counts a small tree right."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from pipeline.layout import PACKAGES, format_layout, layout, parameter_count

ROOT = Path(__file__).resolve().parents[1]


def _fn(source: str) -> ast.FunctionDef:
    return ast.parse(source).body[0]


def test_parameter_count_skips_self_and_counts_star_args_once():
    assert parameter_count(_fn("def f(self, a, b=1, *args, c, **kw): pass")) == 5
    assert parameter_count(_fn("def f(a, /, b): pass")) == 2
    assert parameter_count(_fn("def f(): pass")) == 0


def test_layout_counts_modules_lines_parameters_and_local_imports(tmp_path):
    (tmp_path / "decoding").mkdir()
    (tmp_path / "decoding" / "a.py").write_text(
        "import os\n\n\ndef wide(a, b, c, d):\n    import json\n\n    def inner():\n        from x import y\n"
        "    return 0\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test(a, b, c, d, e, f, g):\n    import sys\n")
    found = layout(tmp_path, top=3)
    assert found.modules["decoding"] == 1 and found.lines["decoding"] == 9 and found.modules["tests"] == 1
    assert found.widest[0] == (4, "decoding/a.py:4 wide")  # tests are not source: their 7 parameters not counted
    assert found.local_imports == 2
    text = format_layout(found)
    assert "most parameters of a function (source packages): 4" in text and all(p in text for p in PACKAGES)


def test_python_m_pipeline_info_layout_prints_the_counts():
    out = subprocess.run([sys.executable, "-m", "pipeline.info", "--layout"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.startswith("package") and "function-local imports" in out
