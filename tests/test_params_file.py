"""params.yaml is generated from the config dataclasses: the defaults live in one place."""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.config import load_config
from pipeline.params_file import render_params

ROOT = Path(__file__).resolve().parents[1]


def test_committed_params_yaml_is_the_generated_one():
    assert (ROOT / "params.yaml").read_text() == render_params(), \
        "params.yaml differs from pipeline/config.py's defaults: run `python -m pipeline.params_file --write`"


def test_generated_file_reads_back_as_the_defaults():
    assert yaml.safe_load(render_params()) == load_config(None).to_dict()


def test_a_changed_default_changes_the_file(monkeypatch):
    from pipeline.sections import SamplingConfig

    before = render_params()
    monkeypatch.setattr(SamplingConfig.__init__, "__defaults__", (0.5, 1.0))
    after = render_params()
    assert "temperature: 0.5" in after and "temperature: 0.5" not in before
