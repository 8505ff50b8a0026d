"""Section `tracking` of params.yaml: `TrackingConfig`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrackingConfig:
    """MLflow for every stage (pipeline/tracking.py); MLFLOW_TRACKING_URI, when set, wins over ``uri``."""

    uri: str = "sqlite:///mlflow.db"  # git-ignored local store
    experiment: str = "branchpoint"  # one experiment; runs are tagged with their stage and git revision
