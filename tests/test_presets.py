"""configs/: every preset loads through the typed config, default.yaml is params.yaml, and ``extends:``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.config import ConfigError, dump_params, load_config

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "configs").glob("*.yaml"))


def test_the_required_presets_exist():
    assert {p.name for p in PRESETS} >= {"quick.yaml", "default.yaml", "gpu-qwen2.5.yaml", "paper-grid.yaml"}


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_preset_loads_and_its_profile_covers_its_action_grid(preset):
    cfg = load_config(preset)
    space = cfg.actions.space()
    biggest = max(1 + a.tree_size for a in space)
    assert max(cfg.profile.target_tokens) >= biggest, f"{preset.name}: profile.target_tokens stop below {biggest}"
    assert max(cfg.profile.draft_rows) >= max(space.K), f"{preset.name}: profile.draft_rows stop below max K"
    assert set(cfg.evaluate.methods) <= set(cfg.collect.methods), f"{preset.name}: evaluate.methods not collected"
    assert load_config(None, []).to_dict().keys() == cfg.to_dict().keys()


def test_default_preset_is_params_yaml():
    assert yaml.safe_load((ROOT / "configs/default.yaml").read_text()) == {"extends": "../params.yaml"}
    assert load_config(ROOT / "configs/default.yaml").to_dict() == load_config(ROOT / "params.yaml").to_dict()


def test_partial_presets_change_only_their_keys():
    base = load_config(ROOT / "params.yaml").to_dict()
    quick = load_config(ROOT / "configs/quick.yaml").to_dict()
    assert quick["model"] == base["model"] and quick["collect"]["root_stride"] == base["collect"]["root_stride"]
    assert len(load_config(ROOT / "configs/quick.yaml").actions.space()) == 18 and quick["prompts"]["max_prompts"] == 12
    paper = load_config(ROOT / "configs/paper-grid.yaml")
    assert len(paper.actions.space()) == 324 and paper.trajectories.top_ps == [0.9, 0.99]
    assert paper.model.target.endswith("Qwen2.5-7B-Instruct") and paper.model.dtype == "bfloat16"  # via gpu preset


def test_extends_merges_key_by_key_and_reports_errors(tmp_path):
    (tmp_path / "base.yaml").write_text("decode:\n  max_new_tokens: 8\n  seed: 3\nsampling:\n  temperature: 0.5\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\ndecode:\n  seed: 4\n")
    cfg = load_config(tmp_path / "child.yaml", ["sampling.top_p=0.9"])
    assert (cfg.decode.max_new_tokens, cfg.decode.seed, cfg.sampling.temperature, cfg.sampling.top_p) == (8, 4, 0.5, 0.9)
    (tmp_path / "loop.yaml").write_text("extends: loop2.yaml\n")
    (tmp_path / "loop2.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "loop.yaml")
    (tmp_path / "orphan.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="nowhere.yaml.*extended by"):
        load_config(tmp_path / "orphan.yaml")
    (tmp_path / "bad.yaml").write_text("extends: base.yaml\ndecode:\n  nope: 1\n")
    with pytest.raises(ConfigError, match="unknown key 'decode.nope'"):
        load_config(tmp_path / "bad.yaml")


def test_a_materialised_preset_is_a_full_params_file(tmp_path):
    """What `python -m pipeline.config PRESET > params.yaml` writes loads back to the same config."""
    cfg = load_config(ROOT / "configs/quick.yaml")
    (tmp_path / "params.yaml").write_text(dump_params(cfg))
    assert load_config(tmp_path / "params.yaml").to_dict() == cfg.to_dict()
