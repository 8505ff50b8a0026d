"""The sections of params.yaml: one module per section, one dataclass each (its fields, defaults, validation).

These dataclasses are the one place defaults live (params.yaml is generated from them:
``python -m pipeline.params_file --write``). A stage module names the sections it reads in ``SECTIONS``;
`pipeline.config.load_config` types and validates only those (and the ones a ``--set`` names), so a setting of a
stage that does not run never fails the one that does. dvc lists this folder in every stage's deps.

    from pipeline.sections.collect import CollectConfig
"""

from __future__ import annotations

from .actions import ActionsConfig
from .chain_selector import ChainSelectorConfig
from .collect import CollectConfig
from .decode import DecodeConfig
from .evaluate import EvaluateConfig
from .export import ExportConfig
from .model import ModelConfig
from .profile import ProfileConfig
from .prompts import PromptsConfig
from .sampling import SamplingConfig
from .tracking import TrackingConfig
from .train import TrainConfig
from .train_draft import TrainDraftConfig
from .trajectories import TrajectoriesConfig

# section name -> its dataclass, in params.yaml order
SECTION_CLASSES: dict[str, type] = {
    "model": ModelConfig,
    "prompts": PromptsConfig,
    "sampling": SamplingConfig,
    "decode": DecodeConfig,
    "trajectories": TrajectoriesConfig,
    "train_draft": TrainDraftConfig,
    "actions": ActionsConfig,
    "collect": CollectConfig,
    "tracking": TrackingConfig,
    "export": ExportConfig,
    "profile": ProfileConfig,
    "train": TrainConfig,
    "chain_selector": ChainSelectorConfig,
    "evaluate": EvaluateConfig,
}


def section_class(name: str) -> type:
    """The dataclass of section ``name``."""
    return SECTION_CLASSES[name]
