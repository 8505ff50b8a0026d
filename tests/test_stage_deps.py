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


def test_check_names_an_uncovered_import_and_an_unread_package(tmp_path):
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    deps = dvc["stages"]["trajectories"]["deps"]
    deps.remove("engine")
    deps.append("evaluation")
    diff = stage_deps.differences(dvc)
    assert "trajectories: imports engine/torch_sampling.py, which no dep covers" in diff
    assert "trajectories: lists evaluation, which it never imports" in diff
    path = tmp_path / "dvc.yaml"
    path.write_text(yaml.safe_dump(dvc))
    run = subprocess.run([sys.executable, "-m", "pipeline.stage_deps", "--check", "--dvc-yaml", str(path)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 1 and "no dep covers" in run.stdout


def test_a_folder_dep_covers_the_files_below_it_only():
    assert stage_deps.covers("engine", "engine/decoder.py")
    assert stage_deps.covers("pipeline/collect.py", "pipeline/collect.py")
    assert not stage_deps.covers("engine", "engine_extra/x.py")
    assert not stage_deps.covers("pipeline/collect.py", "pipeline/collect_more.py")


def test_the_package_cuts_keep_edits_narrow():
    """The reruns an edit causes (python -m pipeline.stage_deps --table): a verifier edit reruns only the stages
    that verify, a lookup or selector edit never reruns the model stages, an evaluation edit only evaluate."""
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())

    def stages_of(area):
        return {s for s, v in dvc["stages"].items() if any(stage_deps.covers(d, area) for d in v["deps"])}

    assert stages_of("verifiers/gbv.py") == {"profile", "collect", "evaluate"}
    assert stages_of("policies/lookup.py") == {"evaluate"}
    assert stages_of("evaluation/report.py") == {"evaluate"}
    assert not stages_of("selector/training.py") & {"trajectories", "profile", "train_draft", "collect"}
