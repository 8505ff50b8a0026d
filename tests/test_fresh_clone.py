"""Issue 22: a stage run in a fresh clone leaves `dvc status` clean (numba's cache and byte code are not deps)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DVC = Path(sys.executable).with_name("dvc")

# the stage: the CLI's cache setup, then one numba cache=True kernel of the verifiers (compiled and cached)
STAGE = ("from pipeline.cli import use_project_caches; use_project_caches(); import numpy as np; "
         "from verifiers.mass_numerics import residual_mass; "
         "open('out.txt', 'w').write(str(residual_mass(np.full(3, 1 / 3), np.full(3, 1 / 3), 0.0)))")
# `first` runs before `warm` and shares its dep: a file that `warm` writes under decoding/ would change it
DVC_YAML = f"""stages:
  first:
    cmd: {sys.executable} -c "open('first.txt', 'w').write('1')"
    deps:
      - decoding
    outs:
      - first.txt
  warm:
    cmd: {sys.executable} -c "{STAGE}"
    deps:
      - first.txt
      - decoding
      - pipeline/cli.py
    outs:
      - out.txt
"""


def _run(args, cwd: Path, env: dict) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.skipif(not DVC.exists(), reason="dvc is not installed next to this python")
def test_stage_in_a_fresh_clone_leaves_dvc_status_clean(tmp_path):
    src = tmp_path / "src"
    tracked = _run(["git", "ls-files", "decoding", ".dvcignore", ".gitignore"], ROOT, dict(os.environ)).split()
    for rel in [*tracked, "pipeline/__init__.py", "pipeline/cli.py"]:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    (src / "dvc.yaml").write_text(DVC_YAML)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t",
               DVC_NO_ANALYTICS="1")
    _run(["git", "init", "-q"], src, env)
    _run([str(DVC), "init", "-q"], src, env)
    _run(["git", "add", "-A"], src, env)
    _run(["git", "commit", "-qm", "src"], src, env)
    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(src), str(clone)], tmp_path, env)
    env["PYTHONPATH"] = str(clone)
    _run([str(DVC), "repro", "-q"], clone, env)
    assert list((clone / ".cache" / "numba").rglob("*.nbi")), "numba's cache is not under .cache/numba"
    assert not list((clone / "decoding").rglob("*.nbi")), "numba wrote its cache next to the sources"
    assert "up to date" in _run([str(DVC), "status"], clone, env)
