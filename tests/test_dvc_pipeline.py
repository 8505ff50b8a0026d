"""dvc.yaml stays consistent with the code: every dep exists, every param is a real config key."""

import dataclasses
from pathlib import Path

import yaml

from pipeline.config import SECTIONS, load_config

ROOT = Path(__file__).resolve().parents[1]


def stages():
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"] or {}


def test_every_stage_runs_a_branchpoint_subcommand():
    from pipeline.cli import COMMANDS

    for name, stage in stages().items():
        words = stage["cmd"].split()
        assert words[0] == "branchpoint" and words[1] in COMMANDS, f"stage {name}: {stage['cmd']}"


def test_deps_exist_and_params_are_config_keys():
    outs = {out if isinstance(out, str) else next(iter(out)) for s in stages().values() for out in s.get("outs", [])}
    for name, stage in stages().items():
        for dep in stage.get("deps", []):
            assert dep in outs or (ROOT / dep).exists(), f"stage {name}: dep {dep} does not exist"
        for param in stage.get("params", []):
            keys = [param] if isinstance(param, str) else list(param)
            for key in keys:
                section, _, field = key.partition(".")
                assert section in SECTIONS, f"stage {name}: unknown params section in {key}"
                if field:
                    names = {f.name for f in dataclasses.fields(SECTIONS[section])}
                    assert field in names, f"stage {name}: {key} is not a config key"


def test_params_file_is_valid():
    load_config(ROOT / "params.yaml")
