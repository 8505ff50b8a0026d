"""The two-stage selector as an exported folder, run torch-free (numpy + onnxruntime, like `export.runtime`).

A cascade folder holds two exported selector folders and a sidecar that describes both::

    cascade.json   {"format": "cascade", "stages": {"stage1": {...}, "stage2": {...}}}: per stage its
                   subfolder, feature set, methods, and the sha256 of its ONNX file and of its sidecar
    stage1/        a target-side selector (needs no draft pass): speculate or take one plain step
    stage2/        a selector that reads the draft's root step: the shape and method when stage 1 speculates

`CascadeRuntime` is `decoding.policy.Cascade` over the two `SelectorRuntime`; stage 2 chooses among its
speculating outputs only (it is asked only once the decision to speculate is taken). `load_selector` opens
either kind of folder, so ``decode --selector`` and ``evaluate`` take both.
"""

from __future__ import annotations

from pathlib import Path

from decoding.features import FeatureSchema
from decoding.files import read_json, sha256_file, write_json_atomic
from decoding.latency import LatencyModel
from decoding.policy import Cascade

from .runtime import ONNX_FILE, SIDECAR_FILE, SelectorArtifactError, SelectorRuntime, read_sidecar

CASCADE_FILE = "cascade.json"
STAGES = ("stage1", "stage2")


def is_cascade(folder: str | Path) -> bool:
    return (Path(folder) / CASCADE_FILE).is_file()


def write_cascade_sidecar(folder: str | Path) -> dict:
    """Describe the exported ``folder/stage1`` and ``folder/stage2`` in ``folder/cascade.json`` (atomic); stage 1
    must read target-side features only."""
    folder = Path(folder)
    stages = {}
    for name in STAGES:
        sub = folder / name
        side = read_sidecar(sub)
        stages[name] = {"folder": name, "feature_set": side["features"]["feature_set"],
                        "methods": list(side["outputs"]["methods"]), "onnx_sha256": sha256_file(sub / ONNX_FILE),
                        "sidecar_sha256": sha256_file(sub / SIDECAR_FILE)}
    if FeatureSchema.from_dict(read_sidecar(folder / "stage1")["features"]).needs_draft:
        raise SelectorArtifactError(f"{folder / 'stage1'}: stage 1 of a cascade must read target-side features only "
                                    f"(its feature set {stages['stage1']['feature_set']!r} needs the draft)")
    sidecar = {"format": "cascade", "stages": stages}
    write_json_atomic(folder / CASCADE_FILE, sidecar)
    return sidecar


class CascadeRuntime(Cascade):
    """A cascade folder, ready to decode: stage 1 at the root, stage 2 after the draft's root step."""

    def __init__(self, folder: str | Path, latency: str | Path | LatencyModel | None = None,
                 methods: list[str] | None = None, calibrate: bool = False) -> None:
        self.folder = Path(folder)
        self.sidecar = read_json(self.folder / CASCADE_FILE, SelectorArtifactError, "export a cascade first")
        if self.sidecar.get("format") != "cascade" or set(self.sidecar.get("stages", {})) != set(STAGES):
            raise SelectorArtifactError(f"{self.folder / CASCADE_FILE}: not a cascade sidecar (stages {STAGES})")
        if isinstance(latency, (str, Path)):
            latency = LatencyModel.load(latency)
        for name in STAGES:
            self._check_stage(name)
        entry = self.sidecar["stages"]
        stage1 = SelectorRuntime(self.folder / entry["stage1"]["folder"], latency, methods=methods,
                                 calibrate=calibrate)  # stage 1 weighs speculating against a plain step
        stage2 = SelectorRuntime(self.folder / entry["stage2"]["folder"], latency, methods=methods,
                                 speculating_only=True)
        super().__init__(stage1, stage2)
        self.methods = [m for m in stage2.methods if methods is None or m in methods]
        self.auto = stage2.auto
        self.feature_set = f"cascade({stage1.feature_set} -> {stage2.feature_set})"

    @property
    def calibration(self):
        """Stage 1's online calibration (`decoding.calibration`; None without ``calibrate``): the decision that
        weighs a step's cost."""
        return self.stage1.calibration

    def _check_stage(self, name: str) -> None:
        entry = self.sidecar["stages"][name]
        sub = self.folder / entry["folder"]
        for file, key in ((ONNX_FILE, "onnx_sha256"), (SIDECAR_FILE, "sidecar_sha256")):
            if not (sub / file).is_file():
                raise SelectorArtifactError(f"{sub / file} not found (cascade stage {name})")
            if sha256_file(sub / file) != entry.get(key):
                raise SelectorArtifactError(f"{sub / file}: sha256 does not match {self.folder / CASCADE_FILE}: the "
                                            "stage was modified or belongs to another export; re-export the cascade")

    def __repr__(self) -> str:
        return f"CascadeRuntime({self.folder}, {self.feature_set}, methods {self.methods})"


def load_selector(folder: str | Path, latency: str | Path | LatencyModel | None = None,
                  methods: list[str] | None = None, calibrate: bool = False) -> SelectorRuntime | CascadeRuntime:
    """The exported selector in ``folder``: a cascade (`CASCADE_FILE`) or a single selector; ``calibrate``: its step
    times corrected online (`decoding.calibration`)."""
    if is_cascade(folder):
        return CascadeRuntime(folder, latency, methods, calibrate)
    return SelectorRuntime(folder, latency, methods=methods, calibrate=calibrate)
