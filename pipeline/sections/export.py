"""Section `export` of params.yaml: `ExportConfig`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExportConfig:
    """Stage export: the trained selector (train.out) as ONNX + sidecar (export/)."""

    out: str = "artifacts/selector"  # selector.onnx + selector.json; `decode --selector` reads it
    parity_rows: int = 256  # held-out roots the ONNX graph must reproduce
    atol: float = 1.0e-4  # max |torch - onnxruntime| of the predicted block efficiency
    mlflow: bool = True  # log the ONNX model and register it
    registered_model: str = "branchpoint-selector"

    def validate(self) -> None:
        if self.parity_rows < 1:
            raise ValueError(f"parity_rows must be >= 1, not {self.parity_rows}")
        if not self.atol > 0:
            raise ValueError(f"atol must be > 0, not {self.atol}")
