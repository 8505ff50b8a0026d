"""The sections of params.yaml: one module per section, one dataclass each (its fields, defaults, validation).

These dataclasses are the one place defaults live (params.yaml is generated from them:
``python -m pipeline.params_file --write``). A stage module names the sections it reads in ``SECTIONS``;
`pipeline.config.load_config` imports, types and validates only those, so an edit to one section's module
reruns only the dvc stages that read that section (`pipeline/stage_deps.py` lists it in their deps).

    from pipeline.sections.collect import CollectConfig
"""

from __future__ import annotations

import importlib

# section name -> its dataclass in pipeline/sections/<name>.py, in params.yaml order
SECTION_CLASSES = {
    "model": "ModelConfig",
    "prompts": "PromptsConfig",
    "sampling": "SamplingConfig",
    "decode": "DecodeConfig",
    "trajectories": "TrajectoriesConfig",
    "train_draft": "TrainDraftConfig",
    "actions": "ActionsConfig",
    "collect": "CollectConfig",
    "tracking": "TrackingConfig",
    "export": "ExportConfig",
    "profile": "ProfileConfig",
    "train": "TrainConfig",
    "chain_selector": "ChainSelectorConfig",
    "evaluate": "EvaluateConfig",
}

def section_class(name: str) -> type:
    """The dataclass of section ``name`` (imports its module only)."""
    return getattr(importlib.import_module(f"{__name__}.{name}"), SECTION_CLASSES[name])
