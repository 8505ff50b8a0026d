"""Put a loaded model on the fastest exact path for its device (`prepare_for_inference`).

On CPU (float32), every ``nn.Linear`` is replaced by a `PackedLinear`: its weight is reordered ONCE into
oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``) and each call runs
``torch.ops.mkldnn._linear_pointwise`` on it. Stock ``nn.Linear`` runs a copy-free GEMV for one row but
lets MKL re-pack the whole weight on every call with two or more rows, so a tree pass over a few tokens
cost 1.4-2x a single step; packed once, a few rows cost about what one row does (numbers in
``docs/engine.md`` and ``benchmarks/results/engine.json``). On CUDA, and for other dtypes, nothing changes.

What stays true after packing:

- the ``weight`` / ``bias`` parameters are the same tensors as before, so tied embeddings (``lm_head``
  sharing ``embed_tokens.weight``) still look up the plain weight, and ``state_dict`` is unchanged;
- a module reached twice (the self-draft reuses the target's first layers) is packed once;
- training still works: with gradients enabled for the weight or the input, `PackedLinear` runs the
  plain ``F.linear``; and a weight changed in place (an optimizer step bumps ``weight._version``) is
  re-packed on the next inference call, so the packed copy is never stale.

Memory: the packed copy is a second float32 copy of each linear weight (the plain weight is kept for
the reasons above): for SmolLM2-135M about 106M + 28M (LM head) floats, i.e. about 540 MB.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

_PACK_DTYPES = (torch.float32,)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `prepare_for_inference` packs linears of this device and dtype (CPU float32 with oneDNN)."""
    return torch.device(device).type == "cpu" and dtype in _PACK_DTYPES and torch.backends.mkldnn.is_available()


def weight_version(t: torch.Tensor) -> int:
    """In-place update counter of ``t``; -1 for an inference tensor (made under ``torch.inference_mode``,
    which keeps no counter)."""
    return -1 if t.is_inference() else t._version


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] reordered once into oneDNN's blocked layout (for `packed_linear`)."""
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + bias`` on a weight packed by `pack_weight` (CPU float32, no autograd)."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


def runs_float(layer: nn.Module, x: torch.Tensor) -> bool:
    """Whether a linear layer prepared for CPU inference (`PackedLinear`, `models.int4.Q8Linear`) must compute the
    plain float product of its ``weight`` and ``bias`` on ``x``: gradients for either or for ``x``, or ``x`` not CPU
    float32."""
    bias = layer.bias
    if torch.is_grad_enabled() and (layer.weight.requires_grad or x.requires_grad or
                                    (bias is not None and bias.requires_grad)):
        return True
    return x.device.type != "cpu" or x.dtype not in _PACK_DTYPES


def replace_linears(module: nn.Module, make, applies) -> int:
    """Replace every plain ``nn.Linear`` below ``module`` for which ``applies(linear)`` by ``make(linear)``, in place;
    returns how many."""
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and applies(child):
                setattr(parent, name, make(child))
                replaced += 1
    return replaced


class PackedLinear(nn.Module):
    """An ``nn.Linear`` whose weight is prepacked once for oneDNN (inference); same parameters, same result."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter: tied embeddings keep sharing it
        self.bias = linear.bias
        self._packed: torch.Tensor | None = None
        self._packed_version = -1
        self.repack()

    def repack(self) -> None:
        """(Re)build the packed copy from the current weight."""
        self._packed = pack_weight(self.weight)
        self._packed_version = weight_version(self.weight)

    def release(self) -> None:
        """Drop the packed copy (a fused copy computes this layer now, `models.lean_layers`); the next call that
        needs it packs it again."""
        self._packed, self._packed_version = None, -2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if runs_float(self, x):
            return nn.functional.linear(x, self.weight, self.bias)
        if self._packed is None or weight_version(self.weight) != self._packed_version:
            self.repack()
        return packed_linear(x, self._packed, None if self.bias is None else self.bias.detach())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def __deepcopy__(self, memo):
        """A deep copy (e.g. a noisy copy of the target) is a plain ``nn.Linear``; pack it again if needed."""
        plain = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                          device=self.weight.device, dtype=self.weight.dtype)
        plain.weight = copy.deepcopy(self.weight, memo)  # through memo: a tied weight stays tied in the copy
        plain.bias = copy.deepcopy(self.bias, memo)
        memo[id(self)] = plain
        return plain


def pack_linears(model: nn.Module) -> int:
    """Replace every plain ``nn.Linear`` below ``model`` by a `PackedLinear` (in place); returns how many
    were packed now (modules already packed, e.g. shared with another model, are skipped)."""
    return replace_linears(model, PackedLinear, lambda m: can_pack(m.weight.device, m.weight.dtype))


def packed_bytes(model: nn.Module) -> int:
    """Bytes held by the packed copies below ``model`` (each module counted once)."""
    seen = {id(m): m for m in model.modules() if isinstance(m, PackedLinear)}
    return sum(m._packed.numel() * m._packed.element_size() for m in seen.values() if m._packed is not None)


def prepare_for_inference(model: nn.Module) -> nn.Module:
    """The model on the fastest exact path for its device, in place: on CPU float32 every linear layer
    prepacked for oneDNN; on CUDA (or another dtype) unchanged. Returns ``model``.

    A model placed by accelerate (``device_map``, hooks on its modules) is left as it is."""
    if getattr(model, "hf_device_map", None) is not None:
        return model
    pack_linears(model)
    return model
