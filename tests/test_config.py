import pytest

from pipeline.config import Config, ConfigError, load_config


def write(tmp_path, text):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_repo_params_file_parses_and_matches_defaults_types():
    cfg = load_config("params.yaml")
    assert cfg.model.target == "embedded:smollm2-135m-instruct"
    assert cfg.sampling.temperature == 1.0 and isinstance(cfg.sampling.temperature, float)
    assert cfg.prompts.split == [0.6, 0.2, 0.1, 0.1]


def test_defaults_without_file():
    assert load_config(None).to_dict() == Config().to_dict()


def test_override_is_typed_and_applied(tmp_path):
    path = write(tmp_path, "decode:\n  max_new_tokens: 8\n")
    cfg = load_config(path, ["decode.max_new_tokens=32", "sampling.temperature=0", "decode.action=4,2,3"])
    assert cfg.decode.max_new_tokens == 32
    assert cfg.sampling.temperature == 0.0 and isinstance(cfg.sampling.temperature, float)
    assert cfg.decode.action == "4,2,3"
    assert "--set" in cfg.source


@pytest.mark.parametrize(
    "text, expected",
    [
        ("decode:\n  max_new_token: 3\n", r"unknown key 'decode.max_new_token'"),
        ("decod:\n  max_new_tokens: 3\n", r"unknown section 'decod'"),
        ("decode:\n  max_new_tokens: three\n", r"'decode.max_new_tokens': expected int"),
        ("sampling:\n  top_p: 1.5\n", r"top_p must be in \(0, 1\]"),
        ("decode: [1, 2]\n", r"section 'decode' must be a mapping"),
        ("decode:\n  seed: 1\n bad indent: [\n", r"not valid YAML at line"),
        ("- just\n- a list\n", r"top level must be a mapping"),
        ("prompts:\n  split: [0.8, 0.1, 0.1]\n", r"split now has four parts \[draft, train, val, test\]"),
        ("prompts:\n  split: [0.5, 0.5, 0.1, 0.1]\n", r"four non-negative fractions summing to 1"),
        ("trajectories:\n  temperatures: [-1.0]\n", r"temperature must be a finite number >= 0"),
        ("trajectories:\n  top_ps: [0.0]\n", r"top_p must be in \(0, 1\]"),
    ],
)
def test_malformed_files_name_the_problem_and_file(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=expected) as info:
        load_config(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("decode.nope=1", r"unknown key 'decode.nope'"),
        ("nope.key=1", r"unknown section 'nope'"),
        ("max_new_tokens=3", r"expected section.key=value"),
        ("sampling.temperature=hot", r"expected float"),
    ],
)
def test_bad_overrides(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(None, [override])


def test_missing_file():
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("does/not/exist.yaml")


def test_a_command_loads_and_validates_only_its_sections(tmp_path):
    # a bad value in a section the command does not read does not stop it; reading that section is a bug
    path = write(tmp_path, "decode:\n  max_new_tokens: 3\nevaluate:\n  ci: 7\n")
    cfg = load_config(path, sections=("model", "decode"))
    assert cfg.loaded == ("model", "decode") and cfg.decode.max_new_tokens == 3
    with pytest.raises(AttributeError, match="section 'evaluate' was not loaded"):
        _ = cfg.evaluate
    with pytest.raises(ConfigError, match=r"ci must be in \(0, 1\)"):
        load_config(path, sections=("evaluate",))
    # an unknown section name fails whatever is loaded; an overridden section is loaded and checked too
    with pytest.raises(ConfigError, match="unknown section 'decod'"):
        load_config(write(tmp_path, "decod:\n  seed: 1\n"), sections=("model",))
    assert load_config(None, ["evaluate.prompts=3"], sections=("model",)).loaded == ("model", "evaluate")
    with pytest.raises(ConfigError, match="'evaluate.prompts': expected int"):
        load_config(None, ["evaluate.prompts=many"], sections=("model",))


def test_a_partial_config_keeps_the_whole_files_digest(tmp_path):
    path = write(tmp_path, "decode:\n  max_new_tokens: 3\n")
    whole, part = load_config(path), load_config(path, sections=("decode",))
    assert whole.params_digest == part.params_digest  # one pipeline run in MLflow (pipeline/tracking.py)
    assert load_config(path, ["model.threads=1"]).params_digest != whole.params_digest
    replaced = part.replace(decode=Config().decode)
    assert replaced.decode.max_new_tokens == 64 and part.decode.max_new_tokens == 3
    assert replaced.params_digest == part.params_digest


def test_every_stage_module_names_the_sections_it_reads():
    import importlib

    from pipeline.cli import COMMANDS
    from pipeline.sections import SECTION_CLASSES

    for name, (module, _) in COMMANDS.items():
        sections = importlib.import_module(module).SECTIONS
        assert sections is None or set(sections) <= set(SECTION_CLASSES), name
