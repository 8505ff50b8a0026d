"""Config validation loads neither torch, numba nor the verifiers (every stage imports pipeline/config.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from decoding.errors import UserInputError
from decoding.method_names import METHOD_NAMES, check_method_name

ROOT = Path(__file__).resolve().parents[1]


def test_method_names_equal_the_registry():
    from verifiers import METHODS

    assert METHOD_NAMES == tuple(METHODS)


def test_unknown_method_names_the_known_ones():
    with pytest.raises(UserInputError, match="unknown verification method 'traversl'; known: bv, gbv"):
        check_method_name("traversl")


def test_validating_the_params_file_imports_no_torch_or_numba():
    code = ("import sys; from pipeline.config import load_config; load_config('params.yaml'); "
            "bad = [m for m in ('torch', 'numba', 'verifiers', 'scipy') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_config_cli_explains_itself_and_names_a_bad_file():
    """``python -m pipeline.config``: --help prints the usage (exit 0); a missing file is one line naming it, no
    traceback (exit 1)."""
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "pipeline.config", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)

    helped = cli("--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: python -m pipeline.config PARAMS_FILE")
    bare = cli()  # no file: the usage goes to stderr, never into a redirected params.yaml
    assert bare.returncode == 1 and bare.stdout == "" and bare.stderr.startswith("usage: python -m pipeline.config")
    missing = cli("nope.yaml")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.strip() == "pipeline.config: config file not found: nope.yaml"
    resolved = cli("configs/quick.yaml", "model.device=cpu")
    assert resolved.returncode == 0 and "device: cpu" in resolved.stdout
