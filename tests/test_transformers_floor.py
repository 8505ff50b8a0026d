"""The transformers floor: declared once (`models.hf_compat.TRANSFORMERS_FLOOR`, the same in pyproject.toml),
tested in CI on that very release (``make test-floor`` sets ``BRANCHPOINT_EXPECT_TRANSFORMERS``), an older one
refused in one line, and the KV cache handed to HF modules under the keyword their version reads."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from tiny_models import save_tiny_model, tiny_lm

from models import hf_compat
from models.hf_compat import (
    TRANSFORMERS_FLOOR,
    UnsupportedTransformersError,
    cache_keyword,
    require_transformers,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_overlay_imports_the_release_ci_expects():
    """Under ``make test-floor`` this run's transformers is the floor itself, not the venv's newer one."""
    expected = os.environ.get("BRANCHPOINT_EXPECT_TRANSFORMERS")
    print(f"transformers {transformers.__version__} from {Path(transformers.__file__).parent}")
    if expected is None:
        pytest.skip("not under make test-floor")
    assert transformers.__version__ == expected


def test_pyproject_and_makefile_declare_the_tested_floor():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.findall(r'"transformers>=([0-9.]+)"', pyproject) == [TRANSFORMERS_FLOOR]
    # run from `make test` (a recursive make), MAKEFLAGS would add "Entering directory" lines: a clean make
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    floor = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(ROOT), "print-transformers-floor"],
                           capture_output=True, text=True, check=True, env=env).stdout.strip()
    assert floor == TRANSFORMERS_FLOOR


def test_an_older_transformers_is_one_line_naming_the_version(monkeypatch, tmp_path):
    folder = save_tiny_model(tmp_path / "m", num_layers=1, seed=0)
    monkeypatch.setattr(hf_compat, "transformers_version", lambda: "4.57.1")
    from models.loading import load_model

    with pytest.raises(UnsupportedTransformersError) as info:
        load_model(f"hf:{folder}", torch.device("cpu"), torch.float32)
    message = str(info.value)
    assert "\n" not in message and "4.57.1" in message and f"transformers>={TRANSFORMERS_FLOOR}" in message
    require_transformers(TRANSFORMERS_FLOOR)
    require_transformers(f"{TRANSFORMERS_FLOOR}.dev0")  # a dev build of the floor release counts as it


def test_the_cli_prints_that_line_and_no_traceback(tmp_path):
    """A stage's user sees the one line (``UserInputError``: status 2), not a traceback from inside a step."""
    folder = save_tiny_model(tmp_path / "m", num_layers=1, seed=0)
    script = ("import sys; from models import hf_compat; hf_compat.transformers_version = lambda: '5.0.0'\n"
              "from pipeline.cli import main\n"
              f"sys.exit(main(['decode', '--prompt', 'w3', '--set', 'model.target=hf:{folder}', "
              f"'--set', 'model.draft=hf:{folder}']))\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         env=os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    assert f"transformers 5.0.0 is installed; branchpoint needs transformers>={TRANSFORMERS_FLOOR}" in run.stderr


def test_cache_keyword_follows_the_signature():
    class New(torch.nn.Module):
        def forward(self, h, cache=None, **kwargs): ...

    class Mid(torch.nn.Module):
        def forward(self, h, past_key_values=None, **kwargs): ...

    class Old(torch.nn.Module):
        def forward(self, h, past_key_value=None, **kwargs): ...

    class Neither(torch.nn.Module):
        def forward(self, h, **kwargs): ...

    assert [cache_keyword(m()) for m in (New, Mid, Old)] == ["cache", "past_key_values", "past_key_value"]
    with pytest.raises(TypeError, match="none of cache, past_key_values, past_key_value"):
        cache_keyword(Neither())
    layer = tiny_lm(1, seed=0).model.layers[0]  # this transformers' own layer: 5.17 past_key_values, 5.25 cache
    assert cache_keyword(layer) in inspect.signature(layer.forward).parameters
