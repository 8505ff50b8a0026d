"""The selector network of ALGORITHMS.md section 6 (a plain ``nn.Module``; training lives elsewhere).

Inputs, in the order of `decoding.features.FeatureSchema.input_shapes` (batch first): one float32 tensor
per hidden-state feature of the feature set (``h_p_prev`` ``[B, H_p]``, ``h_q_prev`` / ``h_q_root``
``[B, H_q]``), then ``scalars`` ``[B, S]``. Every input is standardized inside the network with statistics
fitted on the training split (buffers ``<input>_mean`` / ``<input>_std``, saved with the weights and
exported into the ONNX graph), so callers hand raw features.

Architecture: each hidden-state input -> Linear(H, proj) -> LayerNorm; concatenated with the
standardized scalars -> Linear -> GELU -> Dropout -> Linear -> GELU -> Dropout -> Linear to one output per
action (or per (method, action) for ``method: auto``). Output o is the predicted expected block
efficiency Ê of output o's action; the decision (`argmax Ê / T`) is not part of the network.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn


class SelectorNet(nn.Module):
    """Ê per output from raw root features (see module docstring)."""

    def __init__(self, hidden_sizes: Mapping[str, int], num_scalars: int, num_outputs: int, proj: int = 128,
                 widths: Sequence[int] = (512, 32), dropout: float = 0.1) -> None:
        super().__init__()
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
        """``inputs`` in `input_names` order -> ``[B, num_outputs]`` predicted Ê."""
        if len(inputs) != len(self.input_names):
            raise ValueError(f"SelectorNet expects inputs {self.input_names}, got {len(inputs)} tensors")
        parts = [self.proj[name](self._standardize(name, x)) for name, x in zip(self.hidden_names, inputs)]
        parts.append(self._standardize("scalars", inputs[-1]))
        return self.mlp(torch.cat(parts, dim=-1))
