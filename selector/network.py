"""The selector network of ALGORITHMS.md section 6 (a plain ``nn.Module``; training lives elsewhere).

Inputs, in the order of `decoding.features.FeatureSchema.input_shapes` (batch first): one float32 tensor
per hidden-state feature of the feature set (``h_p_prev`` ``[B, H_p]``, ``h_q_prev`` / ``h_q_root``
``[B, H_q]``), then ``scalars`` ``[B, S]``. Every input is standardized inside the network with statistics
fitted on the training split (buffers ``<input>_mean`` / ``<input>_std``, saved with the weights and
exported into the ONNX graph), so callers hand raw features.

Architecture: each hidden-state input -> Linear(H, proj) -> LayerNorm; concatenated with the
standardized scalars -> Linear -> GELU -> Dropout -> Linear -> GELU -> Dropout -> Linear to one output per
action (or per (method, action) for ``method: auto``). Output o is the predicted expected block
efficiency Ê of output o's action (for the ``throughput`` objective: a decision *score*, not a calibrated
Ê). Known values are not learned (`OutputLayout.constraints`): the empty tree's output is fixed at 1 and
an ``L2 = 0`` chain copies the output of its smallest-K twin, inside the network and so inside the export;
the decision (`argmax Ê / T`, `decoding.pricing.decide`) is not
part of the network.

Output layout (`OutputLayout`): ``method: <name>`` has one output per action of the grid, in
`ActionSpace` order; ``method: auto`` has one output per (method, action), method-major: output
``o = i_method * A + i_action``. Outputs whose method does not apply to their action (NaN labels) are
marked invalid and never chosen, and so are duplicate steps (`OutputLayout.distinct`).

A trained selector on disk (`save_selector` / `load_selector`; the ONNX export reads exactly this):

    <folder>/selector.safetensors   the state dict (weights and the standardization buffers)
    <folder>/selector.json          meta: format, architecture, ``feature_set``, ``schema``
                                    (`decoding.features.FeatureSchema.to_dict`), ``outputs`` (the layout's
                                    ``to_dict`` + ``valid``), ``objective``, ``latency`` (the profile,
                                    `LatencyModel.to_dict`), ``metrics``, ``sampling_range``, ``pair``,
                                    ``dataset`` (path, config hash, roots per split), git revision
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from decoding.actions import Action, parse_action
from decoding.errors import UserInputError
from decoding.files import read_json

FORMAT = "branchpoint-selector"
FORMAT_VERSION = 1
WEIGHTS_FILE = "selector.safetensors"
META_FILE = "selector.json"
AUTO = "auto"


class SelectorLoadError(UserInputError):
    """A selector folder that is missing, incomplete or of another format."""


@dataclass(frozen=True)
class OutputLayout:
    """What each output of a selector predicts: Ê of (method, action) (see module docstring)."""

    methods: tuple[str, ...]  # one method, or every method of ``method: auto``
    actions: tuple[Action, ...]  # the action grid, in ActionSpace order
    auto: bool = False

    def __post_init__(self) -> None:
        if not self.methods or not self.actions:
            raise ValueError("an output layout needs at least one method and one action")
        if not self.auto and len(self.methods) != 1:
            raise ValueError(f"a single-method layout has exactly one method, got {list(self.methods)}")

    @property
    def size(self) -> int:
        return len(self.methods) * len(self.actions)

    def index(self, method: str, action: Action) -> int:
        return self.methods.index(method) * len(self.actions) + self.actions.index(action)

    def output(self, o: int) -> tuple[str, Action]:
        """(method, action) of output ``o``."""
        return self.methods[o // len(self.actions)], self.actions[o % len(self.actions)]

    def method_outputs(self, method: str) -> slice:
        """The outputs of one method (a contiguous block)."""
        start = self.methods.index(method) * len(self.actions)
        return slice(start, start + len(self.actions))

    def distinct(self) -> list[bool]:
        """Per output: False for a duplicate step. A tree of size 0 (``L1 = L2 = 0``) is one plain target
        step under every method and K: only its first output counts. ``L2 = 0`` chains differ only in K,
        which changes nothing (`ActionSpace.canonical`): only the smallest K counts. Decisions never pick a
        duplicate (its label equals its representative's), so the chosen-output histogram names each step
        once and the argmax is not biased toward steps that have many copies."""
        k_min = min(a.K for a in self.actions)
        out, seen_empty = [], False
        for _, a in (self.output(o) for o in range(self.size)):
            if a.tree_size == 0:
                out.append(not seen_empty)
                seen_empty = True
            else:
                out.append(a.L2 > 0 or a.K == k_min)
        return out

    def constraints(self) -> tuple[list[int], dict[int, float]]:
        """Outputs whose value is known, not learned: ``(tied, fixed)``. ``tied[o]`` is the output whose value
        output ``o`` takes (itself for a free output): an ``L2 = 0`` chain is the same tree whatever K, so it
        takes the value of the same method's chain with the smallest K. ``fixed[o]`` is a known value: an
        empty tree (``L1 = L2 = 0``) is one plain target step, Ê = 1 exactly, under every method and K."""
        tied = list(range(self.size))
        fixed: dict[int, float] = {}
        for o in range(self.size):
            method, a = self.output(o)
            if a.tree_size == 0:
                fixed[o] = 1.0
            elif a.L2 == 0:
                same = [b for b in self.actions if b.L2 == 0 and b.L1 == a.L1]
                tied[o] = self.index(method, min(same, key=lambda b: b.K))
        return tied, fixed

    def to_dict(self) -> dict:
        return {"method": AUTO if self.auto else self.methods[0], "auto": self.auto, "methods": list(self.methods),
                "actions": [str(a) for a in self.actions],
                "order": "method-major: output o = i_method * len(actions) + i_action"}

    @classmethod
    def from_dict(cls, d: Mapping) -> OutputLayout:
        auto = bool(d["auto"]) if "auto" in d else d.get("method") == AUTO
        return cls(tuple(d["methods"]), tuple(parse_action(a) for a in d["actions"]), auto)


@dataclass(frozen=True)
class NetShape:
    """The trunk's sizes: the projection width of each hidden-state input, the MLP widths, the dropout."""

    proj: int = 128
    widths: tuple[int, ...] = (512, 32)
    dropout: float = 0.1


class SelectorNet(nn.Module):
    """Ê per output from raw root features (see module docstring); ``tied`` and ``fixed`` are the layout's
    known values (`OutputLayout.constraints`)."""

    def __init__(self, hidden_sizes: Mapping[str, int], num_scalars: int, num_outputs: int,
                 shape: NetShape = NetShape(), tied: Sequence[int] | None = None,
                 fixed: Mapping[int, float] | None = None) -> None:
        super().__init__()
        proj, widths, dropout = shape.proj, shape.widths, shape.dropout
        tied = list(range(int(num_outputs))) if tied is None else [int(t) for t in tied]
        fixed = {int(o): float(v) for o, v in (fixed or {}).items()}
        if len(tied) != int(num_outputs) or any(not 0 <= t < int(num_outputs) or tied[t] != t for t in tied):
            raise ValueError(f"tied must map each of the {num_outputs} outputs to a free output, got {tied}")
        if any(not 0 <= o < int(num_outputs) for o in fixed):
            raise ValueError(f"fixed outputs {sorted(fixed)} out of range for {num_outputs} outputs")
        self.architecture = {"hidden_sizes": {k: int(v) for k, v in hidden_sizes.items()},
                             "num_scalars": int(num_scalars), "num_outputs": int(num_outputs), "proj": int(proj),
                             "widths": [int(w) for w in widths], "dropout": float(dropout), "tied": tied,
                             "fixed": {str(o): v for o, v in sorted(fixed.items())}}
        # known values (`OutputLayout.constraints`), rebuilt from the architecture, so not in the state dict
        self.register_buffer("tied", torch.tensor(tied, dtype=torch.long), persistent=False)
        self.register_buffer("fixed_mask", torch.tensor([o in fixed for o in range(int(num_outputs))]),
                             persistent=False)
        self.register_buffer("fixed_value", torch.tensor([fixed.get(o, 0.0) for o in range(int(num_outputs))],
                                                         dtype=torch.float32), persistent=False)
        self.hidden_names = tuple(hidden_sizes)
        self.input_names = (*self.hidden_names, "scalars")
        self.num_scalars, self.num_outputs = int(num_scalars), int(num_outputs)
        self.proj = nn.ModuleDict({name: nn.Sequential(nn.Linear(int(h), proj), nn.LayerNorm(proj))
                                   for name, h in hidden_sizes.items()})
        sizes = {**{k: int(v) for k, v in hidden_sizes.items()}, "scalars": self.num_scalars}
        for name, size in sizes.items():
            self.register_buffer(f"{name}_mean", torch.zeros(size))
            self.register_buffer(f"{name}_std", torch.ones(size))
        layers: list[nn.Module] = []
        width = proj * len(self.hidden_names) + self.num_scalars
        for w in widths:
            layers += [nn.Linear(width, w), nn.GELU(), nn.Dropout(dropout)]
            width = w
        layers.append(nn.Linear(width, self.num_outputs))
        self.mlp = nn.Sequential(*layers)

    def set_standardization(self, stats: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store (mean, std) per input (fitted on train only); a std below 1e-6 is treated as 1."""
        for name in self.input_names:
            mean, std = stats[name]
            getattr(self, f"{name}_mean").copy_(torch.as_tensor(mean, dtype=torch.float32))
            std = torch.as_tensor(std, dtype=torch.float32)
            getattr(self, f"{name}_std").copy_(torch.where(std < 1e-6, torch.ones_like(std), std))

    def _standardize(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return (x - getattr(self, f"{name}_mean")) / getattr(self, f"{name}_std")

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``inputs`` in `input_names` order -> ``[B, num_outputs]`` predicted Ê (tied outputs copied, fixed
        outputs set: they are never fitted)."""
        if len(inputs) != len(self.input_names):
            raise ValueError(f"SelectorNet expects inputs {self.input_names}, got {len(inputs)} tensors")
        parts = [self.proj[name](self._standardize(name, x)) for name, x in zip(self.hidden_names, inputs[:-1], strict=True)]
        parts.append(self._standardize("scalars", inputs[-1]))
        raw = self.mlp(torch.cat(parts, dim=-1)).index_select(-1, self.tied)
        return torch.where(self.fixed_mask, self.fixed_value.to(raw.dtype), raw)


def save_selector(folder: str | Path, net: SelectorNet, meta: Mapping) -> Path:
    """Write ``net`` (weights + standardization buffers, safetensors) and ``meta`` (JSON) into ``folder``.

    ``meta`` must hold ``feature_set``, ``schema`` and ``outputs`` (an `OutputLayout.to_dict` plus
    ``valid``: one bool per output); the architecture and the format are added here. Files are written to
    temporary names and renamed, so a reader never sees half a selector."""
    from safetensors.torch import save_file

    missing = [k for k in ("feature_set", "schema", "outputs") if k not in meta]
    if missing:
        raise ValueError(f"save_selector: meta lacks {missing}")
    if len(meta["outputs"].get("valid", ())) != net.num_outputs:
        raise ValueError(f"save_selector: meta outputs.valid needs {net.num_outputs} entries")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    full = {"format": FORMAT, "format_version": FORMAT_VERSION, **dict(meta), "architecture": net.architecture,
            "inputs": list(net.input_names), "weights": WEIGHTS_FILE}
    tmp_w = folder / f".{WEIGHTS_FILE}.tmp{os.getpid()}"
    tmp_m = folder / f".{META_FILE}.tmp{os.getpid()}"
    save_file({k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}, str(tmp_w))
    tmp_m.write_text(json.dumps(full, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp_w, folder / WEIGHTS_FILE)
    os.replace(tmp_m, folder / META_FILE)
    return folder


def read_selector_meta(folder: str | Path) -> dict:
    path = Path(folder) / META_FILE
    meta = read_json(path, SelectorLoadError, "train a selector first (`branchpoint train`)")
    if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
        raise SelectorLoadError(f"{path}: not a {FORMAT} v{FORMAT_VERSION} file (format {meta.get('format')!r} "
                                f"v{meta.get('format_version')!r})")
    return meta


def load_selector(folder: str | Path, map_location: str = "cpu") -> tuple[SelectorNet, dict]:
    """``(net in eval mode, meta)`` from a folder written by `save_selector`."""
    from safetensors.torch import load_file

    meta = read_selector_meta(folder)
    arch = meta["architecture"]
    # the hidden inputs in the order the net was trained on (`inputs`, a list): the JSON writer sorts the keys of
    # ``hidden_sizes``, and the net concatenates its projections in input order (issue #43: a selector trained on
    # (h_p_prev, e_root) came back as (e_root, h_p_prev) and shipped with its two hidden inputs swapped)
    order = [n for n in meta.get("inputs", ()) if n in arch["hidden_sizes"]]
    if sorted(order) != sorted(arch["hidden_sizes"]):
        raise SelectorLoadError(f"{Path(folder) / META_FILE}: inputs {meta.get('inputs')} do not name the hidden "
                                f"inputs {sorted(arch['hidden_sizes'])}; the file is damaged or from an old format")
    hidden = {n: arch["hidden_sizes"][n] for n in order}
    net = SelectorNet(hidden, arch["num_scalars"], arch["num_outputs"],
                      NetShape(arch["proj"], tuple(arch["widths"]), arch["dropout"]), arch.get("tied"),
                      {int(o): v for o, v in (arch.get("fixed") or {}).items()})
    weights = Path(folder) / WEIGHTS_FILE
    if not weights.is_file():
        raise SelectorLoadError(f"{weights} not found (the folder holds {META_FILE} but no weights)")
    net.load_state_dict(load_file(str(weights), device=map_location), strict=True)
    return net.eval(), meta
