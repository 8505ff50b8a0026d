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
                    names = {f.name for f in dataclasses.fields(SECTIONS[section])}
                    assert field in names, f"stage {name}: {key} is not a config key"


def test_params_file_is_valid():
    load_config(ROOT / "params.yaml")


OURS = ("decoding", "models", "data_collection", "pipeline", "export")


def _module_file(name: str) -> Path | None:
    path = ROOT / Path(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(path: Path) -> set[str]:
    """Our modules that ``path`` imports by name (also inside functions); package __init__s only when
    imported for themselves."""
    import ast

    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            subs = {f"{base}.{a.name}" for a in node.names if _module_file(f"{base}.{a.name}")}
            found |= subs or {base}
    return {m for m in found if m.split(".")[0] in OURS and _module_file(m)}


def test_every_stage_lists_its_config_and_every_module_it_runs():
    """deps = the stage's script + pipeline/config.py + every module of ours it imports, transitively."""
    from pipeline.cli import COMMANDS

    for name, stage in stages().items():
        deps = stage.get("deps", [])
        todo, seen = [COMMANDS[stage["cmd"].split()[1]][0], "pipeline.config"], set()
        while todo:
            module = todo.pop()
            if module in seen:
                continue
            seen.add(module)
            todo += sorted(_imported_modules(_module_file(module)))
        files = {str(_module_file(m).relative_to(ROOT)) for m in seen}
        missing = sorted(f for f in files if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps))
        assert not missing, f"stage {name} runs {missing} but does not list them in its deps"


def test_every_stage_param_is_in_params_yaml():
    """dvc reads the listed params from params.yaml itself: a key that only has a dataclass default fails
    `dvc repro` with 'Parameters ... are missing'."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for name, stage in stages().items():
        for key in stage.get("params", []):
            section, _, field = key.partition(".")
            assert section in params and (not field or field in (params[section] or {})), \
                f"stage {name}: {key} is not in params.yaml"
