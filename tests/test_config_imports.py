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
    from decoding.verifiers import METHODS

    assert METHOD_NAMES == tuple(METHODS)


def test_unknown_method_names_the_known_ones():
    with pytest.raises(UserInputError, match="unknown verification method 'traversl'; known: bv, gbv"):
        check_method_name("traversl")


def test_validating_the_params_file_imports_no_torch_or_numba():
    code = ("import sys; from pipeline.config import load_config; load_config('params.yaml'); "
            "bad = [m for m in ('torch', 'numba', 'decoding.verifiers', 'scipy') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stdout + run.stderr
