"""MLflow for every stage: one tracking store, one experiment, runs tagged with the stage and git revision.

The store is ``tracking.uri`` (default ``sqlite:///mlflow.db``, git-ignored) unless ``MLFLOW_TRACKING_URI``
is set; the experiment is ``tracking.experiment``. Compare runs with
``mlflow ui --backend-store-uri sqlite:///mlflow.db``.
"""

from __future__ import annotations

import os
import subprocess


def git_revision() -> str:
    """The checkout's commit (with ``-dirty`` when the tree has uncommitted changes), or ``unknown``."""
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def tracking_uri(cfg) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or cfg.tracking.uri


def start_run(cfg, stage: str, run_name: str | None = None, tags: dict | None = None):
    """``mlflow.start_run`` in the project's experiment, tagged ``stage`` and ``git_revision``."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri(cfg))
    mlflow.set_experiment(cfg.tracking.experiment)
    return mlflow.start_run(run_name=run_name or stage,
                            tags={"stage": stage, "git_revision": git_revision(), **(tags or {})})
