"""evaluate's choice of TEST units: one trajectory per prompt, every sampling setting represented."""

from collections import Counter

from data_collection import trajectory_store as trajectories_module
from data_collection.trajectory_store import Trajectory
from pipeline.config import load_config
from pipeline.evaluate import pick_units


def _trajs(prompts: int):
    return [Trajectory(f"p{i}", "humaneval", "test", temp, 1.0, 0, [1, 2], [3, 4])
            for i in range(prompts) for temp in (1.0, 0.6)]  # every prompt at both settings (all_settings)


def test_one_unit_per_prompt_and_both_settings_are_decoded(monkeypatch):
    monkeypatch.setattr(trajectories_module, "load_trajectories", lambda path, splits=None: _trajs(40))
    cfg = load_config(None, ["evaluate.prompts=20"])
    units, available = pick_units(cfg)
    assert available == 40 and len(units) == 20
    assert len({u.prompt_id for u in units}) == 20
    temps = Counter(u.temperature for u in units)
    assert temps[1.0] >= 5 and temps[0.6] >= 5  # the stable sort used to pick the first listed setting only
    again, _ = pick_units(cfg)
    assert [(u.prompt_id, u.temperature) for u in again] == [(u.prompt_id, u.temperature) for u in units]
