"""The branchpoint pipeline: the CLI (`pipeline.cli`), its typed config and one module per dvc stage.

``PROCESS_START_MS``: when this stage's process started. The CLI imports this package first, and the stage's
MLflow run (and its pipeline parent) start at this time, not when they begin logging (`pipeline/tracking.py`)."""

from __future__ import annotations

import time

PROCESS_START_MS = int(time.time() * 1000)
