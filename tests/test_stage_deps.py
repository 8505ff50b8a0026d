"""pipeline/stage_deps.py: the code deps of a stage are the files its imports reach (no more, no less)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

from pipeline import stage_deps

ROOT = Path(__file__).resolve().parents[1]


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_walk_follows_lazy_and_relative_imports_and_package_data(tmp_path):
    _write(tmp_path, {
        "pipeline/__init__.py": "",
        "pipeline/stage.py": """
            from typing import TYPE_CHECKING
            from decoding import Name
            if TYPE_CHECKING:
                from decoding import typing_only
            def run():
                from decoding.sub import inner
        """,
        "decoding/__init__.py": '_EXPORTS = {"Name": ".named"}\n',
        "decoding/named.py": "from . import helper\n",
        "decoding/helper.py": 'SETS = "prompt_sets"\n',
        "decoding/prompt_sets/a.jsonl": "{}\n",
        "decoding/typing_only.py": "",
        "decoding/sub/__init__.py": "",
        "decoding/sub/inner.py": "import numpy\n",
        "decoding/unused.py": "",
    })
    assert stage_deps.code_deps(["pipeline.stage"], tmp_path) == [
        "decoding/__init__.py", "decoding/helper.py", "decoding/named.py", "decoding/prompt_sets",
        "decoding/sub/__init__.py", "decoding/sub/inner.py", "pipeline/__init__.py", "pipeline/stage.py"]


def test_rewrite_replaces_only_code_deps_and_keeps_the_rest():
    text = textwrap.dedent("""\
        stages:
          a:
            # comment kept
            cmd: branchpoint collect
            deps:
              - decoding
              - data/x
            params:
              - collect.seed
        """)
    out = stage_deps.rewrite(text, {"a": ["decoding/actions.py", "data/x"]})
    assert yaml.safe_load(out)["stages"]["a"]["deps"] == ["decoding/actions.py", "data/x"]
    assert "# comment kept" in out and yaml.safe_load(out)["stages"]["a"]["params"] == ["collect.seed"]


def test_check_reports_a_missing_and_an_extra_dep(tmp_path):
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    deps = dvc["stages"]["trajectories"]["deps"]
    dropped = next(d for d in deps if d.startswith("decoding/"))
    deps.remove(dropped)
    deps.append("evaluation/report.py")
    diff = stage_deps.differences(dvc)
    assert f"trajectories: missing {dropped}" in diff
    assert "trajectories: not imported evaluation/report.py" in diff
    path = tmp_path / "dvc.yaml"
    path.write_text(yaml.safe_dump(dvc))
    run = subprocess.run([sys.executable, "-m", "pipeline.stage_deps", "--check", "--dvc-yaml", str(path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 1 and "--write" in run.stderr


def test_a_verifier_edit_reruns_only_the_stages_that_verify():
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    verifier = [s for s, v in dvc["stages"].items() if "decoding/verifiers/gbv.py" in v["deps"]]
    assert verifier and "trajectories" not in verifier, verifier
