"""dvc.yaml stays consistent with the code: every dep exists, every param is a real config key."""

import dataclasses
from pathlib import Path

import yaml

from pipeline.config import SECTIONS, load_config
from pipeline.sections import section_class

ROOT = Path(__file__).resolve().parents[1]


def stages():
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"] or {}


def test_every_stage_runs_a_branchpoint_subcommand():
    from pipeline.cli import COMMANDS

    for name, stage in stages().items():
        words = stage["cmd"].split()
        assert words[0] == "branchpoint" and words[1] in COMMANDS, f"stage {name}: {stage['cmd']}"


def test_deps_exist_and_params_are_config_keys():
    outs = {out if isinstance(out, str) else next(iter(out))  # a path, or {path: {persist: true}}
            for stage in stages().values() for out in stage.get("outs", [])}
    for name, stage in stages().items():
        for dep in stage.get("deps", []):
            assert dep in outs or (ROOT / dep).exists(), f"stage {name}: dep {dep} does not exist"
        for param in stage.get("params", []):
            keys = [param] if isinstance(param, str) else list(param)
            for key in keys:
                section, _, field = key.partition(".")
                assert section in SECTIONS, f"stage {name}: unknown params section in {key}"
                if field:
                    names = {f.name for f in dataclasses.fields(section_class(section))}
                    assert field in names, f"stage {name}: {key} is not a config key"


def test_a_stage_lists_params_only_of_the_sections_its_command_loads():
    """dvc reruns a stage when a listed param changes: each must be one the stage's code can read, i.e. in a
    section its module names in SECTIONS (the only sections `branchpoint <cmd>` loads)."""
    from pipeline.cli import COMMANDS
    from pipeline.stage_deps import declared_sections

    for name, stage in stages().items():
        loaded = declared_sections(COMMANDS[stage["cmd"].split()[1]][0])
        for key in stage.get("params", []):
            section = (key if isinstance(key, str) else next(iter(key))).partition(".")[0]
            assert section in loaded, f"stage {name}: param {key} is of a section it does not load ({loaded})"


def test_params_file_is_valid():
    load_config(ROOT / "params.yaml")


def test_every_stage_lists_the_packages_it_runs():
    """A stage's code deps (packages, and its own pipeline/ modules) cover every project file its command imports,
    and list no package it never imports (pipeline/stage_deps.py): no stage misses an edit of what it runs."""
    from pipeline.stage_deps import differences

    diff = differences(yaml.safe_load((ROOT / "dvc.yaml").read_text()))
    assert not diff, "dvc.yaml's code deps do not match the imports:\n" + "\n".join(diff)


def test_dvc_yaml_stays_short():
    """Package-level deps and one-line lists keep dvc.yaml readable (issue #47: under 250 lines)."""
    assert len((ROOT / "dvc.yaml").read_text().splitlines()) < 250


def test_every_stage_param_is_in_params_yaml():
    """dvc reads the listed params from params.yaml itself: a key that only has a dataclass default fails
    `dvc repro` with 'Parameters ... are missing'."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for name, stage in stages().items():
        for key in stage.get("params", []):
            section, _, field = key.partition(".")
            assert section in params and (not field or field in (params[section] or {})), \
                f"stage {name}: {key} is not in params.yaml"


# Fields of a stage's own section that cannot change its outputs, so an edit of them reruns nothing: CPU threads,
# sequences per batch of a batch-invariant forward, and where MLflow records the run.
NOT_OUTPUT_KNOBS = {
    "trajectories": {"threads", "batch_size"},
    "train_draft": {"threads", "forward_batch_size", "tracking_uri", "experiment"},
}


def test_a_stage_lists_every_field_of_its_own_section():
    """A field of the stage's own section missing from its params is one dvc does not watch: editing it (e.g.
    train_draft.unroll, which stop 57 added and first forgot here) would leave the stage's outputs stale."""
    for name, stage in stages().items():
        if name not in SECTIONS:
            continue
        listed = {key.partition(".")[2] for key in stage.get("params", []) if key.startswith(f"{name}.")}
        fields = {f.name for f in dataclasses.fields(section_class(name))}
        missing = fields - listed - NOT_OUTPUT_KNOBS.get(name, set())
        assert not missing, f"stage {name}: dvc.yaml does not list {sorted(missing)} of its own section"
