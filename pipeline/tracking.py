"""MLflow for every stage: one tracking store, one experiment, one parent run per pipeline run.

The store is ``tracking.uri`` (default ``sqlite:///mlflow.db``, git-ignored) unless ``MLFLOW_TRACKING_URI``
is set; the experiment is ``tracking.experiment``. Compare runs with
``mlflow ui --backend-store-uri sqlite:///mlflow.db``.

Stages are separate processes (``dvc repro`` runs one command each), so the parent run of a pipeline run
is found again through a small file: ``<model.cache_dir>/mlflow/parent-<key>.json``, ``key`` = the git
revision + a hash of the resolved config. Every stage of the same revision and params nests its run under
that parent (tag ``mlflow.parentRunId``); a new revision or changed params starts a new parent.
``BRANCHPOINT_PARENT_RUN_ID`` names the parent explicitly (e.g. a driver script that made its own), and
``BRANCHPOINT_PARENT_RUN_ID=`` (empty) turns nesting off. Each stage run starts when its process started
(so its duration spans the stage's work, not only the logging at its end); the parent's end time moves
to the end of the latest stage.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from pipeline import PROCESS_START_MS  # set when the CLI first imports the package

PARENT_ENV = "BRANCHPOINT_PARENT_RUN_ID"


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


def pipeline_key(cfg, revision: str) -> str:
    """What identifies one pipeline run: the revision and the params file's values (every section, the ones
    the stage did not load included: `Config.params_digest`), so all stages of one `dvc repro` share it."""
    return hashlib.sha256(f"{revision}\n{tracking_uri(cfg)}\n{cfg.params_digest}".encode()).hexdigest()[:16]


def _client(cfg):
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(tracking_uri(cfg))
    experiment = mlflow.set_experiment(cfg.tracking.experiment)
    return MlflowClient(tracking_uri(cfg)), experiment.experiment_id


def parent_run_id(cfg, revision: str | None = None) -> str | None:
    """The pipeline run's parent run id (made on first use), or None when ``BRANCHPOINT_PARENT_RUN_ID=``."""
    from decoding.files import write_json_atomic

    if PARENT_ENV in os.environ:
        return os.environ[PARENT_ENV] or None
    revision = revision or git_revision()
    client, experiment_id = _client(cfg)
    path = Path(cfg.model.cache_dir) / "mlflow" / f"parent-{pipeline_key(cfg, revision)}.json"
    if path.is_file():
        try:
            run_id = json.loads(path.read_text())["run_id"]
            if client.get_run(run_id).info.experiment_id == experiment_id:
                return run_id
        except Exception:  # noqa: BLE001 - a stale or foreign file: start a new parent
            pass
    run = client.create_run(experiment_id, start_time=PROCESS_START_MS, run_name=f"pipeline {revision[:12]}",
                            tags={"stage": "pipeline", "git_revision": revision})
    client.set_terminated(run.info.run_id, end_time=int(time.time() * 1000))
    write_json_atomic(path, {"run_id": run.info.run_id, "git_revision": revision})
    return run.info.run_id


def stage_tags(cfg, stage: str, tags: dict | None = None) -> dict:
    """Tags of a stage run: ``stage``, ``git_revision`` and the parent (``mlflow.parentRunId``) when nesting."""
    revision = git_revision()
    out = {"stage": stage, "git_revision": revision, **(tags or {})}
    parent = parent_run_id(cfg, revision)
    if parent:
        out["mlflow.parentRunId"] = parent
    return out


def finish_parent(cfg, tags: dict) -> None:
    """Move the parent run's end to now (it spans every stage run so far)."""
    parent = tags.get("mlflow.parentRunId")
    if parent:
        client, _ = _client(cfg)
        client.set_terminated(parent, end_time=int(time.time() * 1000))


def lightning_logger(cfg, stage: str, run_name: str, tags: dict | None = None):
    """A Lightning ``MLFlowLogger`` in the project's experiment, its run nested under the pipeline's parent."""
    from pytorch_lightning.loggers import MLFlowLogger

    return MLFlowLogger(experiment_name=cfg.tracking.experiment, tracking_uri=tracking_uri(cfg), run_name=run_name,
                        tags=stage_tags(cfg, stage, tags))


def selector_tags(cfg) -> dict:
    """Which selector a stage measured: the exported sidecar's ONNX sha256 and, found through the export run
    that logged that file (tag ``onnx_sha256``), the train run it came from (``train_run_id``)."""
    try:
        sha = json.loads((Path(cfg.export.out) / "selector.json").read_text()).get("onnx_sha256")
    except (OSError, ValueError, AttributeError):  # no exported selector (or not one): nothing to link
        return {}
    tags = {"selector_sha256": str(sha)}
    client, experiment_id = _client(cfg)
    runs = client.search_runs([experiment_id], f"tags.stage = 'export' and tags.onnx_sha256 = '{sha}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if runs and "train_run_id" in runs[0].data.tags:
        tags.update(train_run_id=runs[0].data.tags["train_run_id"], export_run_id=runs[0].info.run_id)
    return tags


@contextmanager
def start_run(cfg, stage: str, run_name: str | None = None, tags: dict | None = None):
    """An active MLflow run in the project's experiment, tagged (`stage_tags`) and nested under the pipeline's
    parent, starting when this process started (its duration spans the stage)."""
    import mlflow

    client, experiment_id = _client(cfg)
    all_tags = stage_tags(cfg, stage, {**(selector_tags(cfg) if stage == "evaluate" else {}), **(tags or {})})
    run = client.create_run(experiment_id, start_time=PROCESS_START_MS, tags=all_tags, run_name=run_name or stage)
    try:
        with mlflow.start_run(run_id=run.info.run_id) as active:
            yield active
    finally:
        finish_parent(cfg, all_tags)
