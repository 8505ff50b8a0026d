"""When this stage's process started: the CLI imports this module first, and the stage's MLflow run (and its
pipeline parent) start at this time, not when they begin logging (`pipeline/tracking.py`)."""

from __future__ import annotations

import time

PROCESS_START_MS = int(time.time() * 1000)
