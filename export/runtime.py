"""`SelectorRuntime`: run an exported selector with numpy and onnxruntime only (no torch, no transformers).

An exported selector is a folder (written by ``branchpoint export``)::

    selector.onnx   inputs: the features of the schema (float32, batch first) and ``step_seconds``
                    [batch, outputs] (T(c, a) of every output); outputs: ``expected_block_efficiency``
                    [batch, outputs] (named ``score`` for a ``throughput`` selector: decision scores, not
                    Ê; the sidecar's ``outputs.names``) and ``choice`` [batch] (int64, argmax over the
                    valid outputs of the first output / T)
    selector.json   the sidecar: feature schema, output table (method, action), latency profile, pair,
                    training facts, versions, and the ONNX file's sha256

The runtime checks the sha256, checks that the ONNX inputs match the sidecar's schema, validates every
feature vector it is given (wrong dims, missing or extra inputs, NaN: one clear `FeatureError`), prices
the actions with a latency profile (the one the selector was trained with, or a fresh one from
``branchpoint profile`` on the machine where it runs; `decoding.pricing`, the prices training used) and implements
the decoder's policy protocol (`decoding.policy.Policy`): ``select(RootFeatures) -> Choice``.

``methods=[...]`` restricts an ``auto`` selector to some of its methods: the decision becomes the argmax of
Ê / T over the valid outputs of those methods only (computed here with numpy from the graph's Ê, the same
rule and tie order as the graph's ``choice``), so the other methods' outputs are never chosen.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from decoding import pricing
from decoding.actions import parse_action
from decoding.errors import UserInputError
from decoding.features import FeatureError, FeatureSchema
from decoding.files import read_json, sha256_file
from decoding.latency import BlockMemo, LatencyModel
from decoding.policy import Choice, Policy, RootFeatures

ONNX_FILE = "selector.onnx"
SIDECAR_FILE = "selector.json"
STEP_SECONDS = "step_seconds"
OUTPUTS = ("expected_block_efficiency", "choice")
SCORE_OUTPUTS = ("score", "choice")  # the throughput objective's outputs are decision scores, not Ê


def onnx_output_names(objective: str | None) -> tuple[str, str]:
    """The graph's output names for a selector trained with ``objective``."""
    return SCORE_OUTPUTS if objective == "throughput" else OUTPUTS


class SelectorArtifactError(UserInputError):
    """An exported selector folder that is missing, tampered with or inconsistent."""


def read_sidecar(folder: str | Path) -> dict:
    return read_json(Path(folder) / SIDECAR_FILE, SelectorArtifactError, "export a selector first (`branchpoint export`)")


def _schema_lists(features: dict) -> dict[str, list]:
    """The parts of a sidecar's feature schema that the graph depends on: names, order and shapes."""
    return {
        "inputs": [(i.get("name"), list(i.get("shape", []))[1:]) for i in features.get("inputs", [])],
        "scalars": [s.get("name") for s in features.get("scalars", [])],
        "hidden": [(h.get("name"), h.get("size")) for h in features.get("hidden", [])],
    }


def check_sidecar_schema(features: dict, schema: FeatureSchema, where: str | Path) -> None:
    """Raise `SelectorArtifactError` when the sidecar's feature list (names, order, shapes) differs from what this
    code computes for its feature set (`decoding.features`): the first differing part, both versions."""
    got, want = _schema_lists(features), _schema_lists(schema.to_dict())
    for part in ("inputs", "hidden", "scalars"):
        if got[part] == want[part]:
            continue
        extra = [x for x in got[part] if x not in want[part]]
        missing = [x for x in want[part] if x not in got[part]]
        what = f"extra {extra}" if extra else ""
        what += ("; " if what and missing else "") + (f"missing {missing}" if missing else "")
        raise SelectorArtifactError(
            f"{where}: the sidecar's feature {part} {got[part]} differ from feature set {schema.feature_set!r} "
            f"as this code computes it {want[part]} ({what or 'same names, other order or shapes'}); the selector "
            "was exported by another version of branchpoint: re-export it")


SECONDS_BLOCK = 64  # context lengths priced together by `SelectorRuntime.step_seconds` (at most 8 blocks kept)


class SelectorRuntime(Policy):
    """An exported selector, ready to choose the action (and method) of each decoding step."""

    def __init__(self, folder: str | Path, latency: str | Path | LatencyModel | None = None,
                 providers: tuple[str, ...] = ("CPUExecutionProvider",), methods: list[str] | None = None) -> None:
        import onnxruntime as ort

        self.folder = Path(folder)
        self.sidecar = read_sidecar(self.folder)
        onnx_path = self.folder / ONNX_FILE
        if not onnx_path.is_file():
            raise SelectorArtifactError(f"{onnx_path} not found")
        digest = sha256_file(onnx_path)
        if digest != self.sidecar.get("onnx_sha256"):
            raise SelectorArtifactError(f"{onnx_path}: sha256 {digest[:12]}... does not match the sidecar's "
                                        f"{str(self.sidecar.get('onnx_sha256'))[:12]}...: the file was modified or "
                                        "belongs to another export; re-export it")
        self.schema = FeatureSchema.from_dict(self.sidecar["features"])
        out = self.sidecar["outputs"]
        self.methods = list(out["methods"])
        self.table = [(m, parse_action(a)) for m, a in out["table"]]  # output o -> (method, action)
        self.auto = bool(out.get("auto", False))
        self.actions = [parse_action(a) for a in out["actions"]]
        self.valid = np.asarray(out.get("valid", [True] * len(self.table)), dtype=bool)  # [outputs]
        self.allowed = self._allowed(methods)  # [outputs] bool, or None: every output
        if isinstance(latency, LatencyModel):
            self.latency = latency
        elif latency is not None:
            self.latency = LatencyModel.load(latency)
        else:
            self.latency = LatencyModel.from_dict(self.sidecar["latency_profile"])
        # One thread, no spinning: a batch-1 decision is ~50 us of work, and onnxruntime's default pool of
        # spinning workers would keep stealing the cores from the target pass that follows every decision.
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(onnx_path), sess_options=opts, providers=list(providers))
        self.output_names = tuple(out.get("names") or OUTPUTS)
        self._check_session()
        check_sidecar_schema(self.sidecar["features"], self.schema, self.folder / SIDECAR_FILE)
        self._seconds = BlockMemo(self._price_block, SECONDS_BLOCK, 8 * SECONDS_BLOCK)  # context length -> step_seconds
        self.needs_hidden_states = bool(self.schema.hidden)
        self.needs_draft = self.schema.needs_draft
        self.feature_set = self.schema.feature_set

    def _allowed(self, methods: list[str] | None) -> np.ndarray | None:
        """``[outputs]`` mask of the valid outputs of ``methods``; None: no restriction."""
        if methods is None:
            return None
        unknown = [m for m in methods if m not in self.methods]
        if unknown or not methods:
            raise SelectorArtifactError(f"{self.folder}: cannot restrict the selector to methods {list(methods)}: it "
                                        f"predicts only {self.methods}")
        mask = np.array([m in methods for m, _ in self.table]) & self.valid
        if not mask.any():
            raise SelectorArtifactError(f"{self.folder}: methods {list(methods)} have no valid output")
        return mask

    def _check_session(self) -> None:
        expected = {**self.schema.input_shapes(), STEP_SECONDS: (len(self.table),)}
        got = {i.name: tuple(i.shape[1:]) for i in self.session.get_inputs()}
        if set(got) != set(expected) or any(tuple(got[k]) != tuple(v) for k, v in expected.items()):
            raise SelectorArtifactError(f"{self.folder / ONNX_FILE}: inputs {got} do not match the sidecar's feature "
                                        f"schema {expected}; the sidecar and the ONNX file are from different exports")

    def step_seconds(self, context_length: int) -> np.ndarray:
        """``[outputs]`` seconds of one step of every output at this context length, as training priced them
        (`decoding.pricing.step_seconds` with the feature set's deciding cost and the selector's own inference time).
        Priced for `SECONDS_BLOCK` context lengths at once and kept (`decoding.latency.BlockMemo`); a copy, so a
        caller's edit does not reach the kept row."""
        return self._seconds.get(int(context_length)).copy()

    def _price_block(self, lengths: np.ndarray) -> np.ndarray:
        """``[block, outputs]`` float32 `step_seconds` of each of the context lengths ``lengths`` ``[block]``."""
        return pricing.step_seconds(self.latency, lengths, self.actions, self.methods, self.schema.feature_set,
                                    self.inference_seconds).astype(np.float32)

    def run_graph(self, inputs: dict[str, np.ndarray], step_seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Batched: ``(Ê [B, outputs], choice [B])`` for validated feature arrays (batch first); for a
        ``throughput`` selector the first array holds its decision scores (``output_names[0]`` says which)."""
        self.schema.validate(inputs, batched=True)
        feed = {k: np.asarray(v, dtype=np.float32) for k, v in inputs.items()}
        feed[STEP_SECONDS] = np.asarray(step_seconds, dtype=np.float32)
        e, choice = self.session.run(list(self.output_names), feed)
        if self.allowed is not None:  # the graph's rule, over the allowed outputs only
            choice = pricing.decide(e, feed[STEP_SECONDS], self.allowed).astype(np.int64)
        return e, choice

    @property
    def inference_seconds(self) -> float:
        """The selector's own inference time per step, as the export measured it (part of every output's T)."""
        return float(self.sidecar.get("inference_seconds") or 0.0)

    def _decide_one(self, features: RootFeatures) -> tuple[np.ndarray, int, np.ndarray]:
        """``(first output [outputs], chosen output, step_seconds [outputs])`` at one root."""
        x = self.schema.vectorize(features, self.latency)
        seconds = self.step_seconds(features.context_length)
        e, choice = self.run_graph({k: v[None] for k, v in x.items()}, seconds[None])
        return e[0], int(choice[0]), seconds

    def select(self, features: RootFeatures) -> Choice:
        """The decoder's selector protocol: the output with the best predicted tokens per second."""
        _, o, _ = self._decide_one(features)
        method, action = self.table[o]
        return Choice(action, method)

    def __repr__(self) -> str:
        only = ""
        if self.allowed is not None:
            kept = sorted({m for (m, _), ok in zip(self.table, self.allowed, strict=True) if ok})
            only = f", restricted to {kept}"
        return (f"SelectorRuntime({self.folder}, {self.schema.feature_set}, methods {self.methods}, "
                f"{len(self.table)} outputs{only})")


__all__ = ["FeatureError", "SelectorArtifactError", "SelectorRuntime", "check_sidecar_schema", "read_sidecar"]
