"""KV caches of the engine: a transformers ``DynamicCache`` plus the position id of every slot.

Terms:
- *slot*: index along the sequence axis of the cache (``keys[:, :, slot, :]``);
- *position*: the rotary position id the token at that slot was processed with. On the accepted
  sequence slot == position; tree nodes processed in a tree pass sit at ``slot >= ctx_len`` with
  position ``ctx_len + depth``;
- *pruning*: after verification, keep only the slots of the accepted path, moved to contiguous
  slots right after the context, and drop everything else. The context is never re-computed.

Every model call goes through `call_model`, which uses the HF causal-LM convention
``model(input_ids, attention_mask, position_ids, <cache kwarg>, use_cache=True)``. transformers 5.x
names the cache keyword ``cache`` (``past_key_values`` is deprecated); other modules following the
older convention (e.g. a self-speculative draft) are called with ``past_key_values``.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

CACHE_KEYWORDS = ("cache", "past_key_values", "past_key_value")  # newest first (5.25, 5.17, decoder layers < 4.56)

_CACHE_KWARG: dict[type, str | None] = {}
_KEEPS_LOGITS: dict[type, bool] = {}


def declared_cache_kwarg(module: torch.nn.Module) -> str | None:
    """The first of `CACHE_KEYWORDS` that ``module.forward`` names, None when it names none (read once per class).
    A name matters: HF forwards also take ``**kwargs``, where a cache under the wrong name is silently dropped."""
    cls = type(module)
    if cls not in _CACHE_KWARG:
        params = inspect.signature(module.forward).parameters
        _CACHE_KWARG[cls] = next((k for k in CACHE_KEYWORDS if k in params), None)
    return _CACHE_KWARG[cls]


def cache_kwarg(model: torch.nn.Module) -> str:
    """`declared_cache_kwarg`, else ``"past_key_values"`` (the older convention, e.g. a forward of ``**kwargs``)."""
    return declared_cache_kwarg(model) or "past_key_values"


def takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` can skip the head on all but the last positions (``logits_to_keep``)."""
    cls = type(model)
    if cls not in _KEEPS_LOGITS:
        _KEEPS_LOGITS[cls] = "logits_to_keep" in inspect.signature(model.forward).parameters
    return _KEEPS_LOGITS[cls]


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


class _Growing:
    """One of a layer's cache tensors ``[B, H, S, d]`` in a buffer with room to grow: appending copies only the new
    slots (`DynamicLayer` concatenates the whole cache on every forward: ~25 us per layer per step here)."""

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None  # [B, H, capacity, d]
        self.length = 0

    def view(self) -> torch.Tensor | None:
        return None if self.buf is None else self.buf[:, :, :self.length]

    def _is_prefix_of_buffer(self, value: torch.Tensor) -> bool:
        b = self.buf
        return (b is not None and value.dim() == 4 and value.data_ptr() == b.data_ptr() and value.dtype == b.dtype
                and value.shape[:2] == b.shape[:2] and value.shape[3] == b.shape[3] and value.stride() == b.stride()
                and value.shape[2] <= b.shape[2])

    def assign(self, value: torch.Tensor | None) -> None:
        """``layer.keys = value``: a prefix of the buffer (a crop) only shortens it; anything else is copied in."""
        if value is None or value.numel() == 0:
            self.buf, self.length = None, 0
        elif self._is_prefix_of_buffer(value):
            self.length = value.shape[2]
        else:
            self.buf, self.length = None, 0
            self.append(value)

    def reserve(self, like: torch.Tensor, n: int, capacity: int = 0) -> torch.Tensor:
        """The buffer, with room for ``n`` slots after those in use, for slots shaped and typed as ``like``
        ``[B, H, *, d]`` (grown, the used slots copied over, when it has no room or another form). ``capacity``:
        the size of a new buffer, exactly (0: twice the slots needed, at least 64)."""
        need = self.length + n
        b = self.buf
        if (b is None or need > b.shape[2] or (capacity and b.shape[2] != capacity) or b.shape[:2] != like.shape[:2]
                or b.shape[3] != like.shape[3] or b.dtype != like.dtype
                or (b.is_inference() and not torch.is_inference_mode_enabled())):
            # (a buffer made under inference_mode cannot be written outside it: a fresh one then)
            grown = like.new_empty((*like.shape[:2], capacity or max(2 * need, 64), like.shape[3]))
            if b is not None and self.length:
                grown[:, :, :self.length] = b[:, :, :self.length]
            self.buf = b = grown
        return b

    def append(self, x: torch.Tensor) -> torch.Tensor:
        """Add ``x`` ``[B, H, n, d]`` after the slots in use; returns the view of all of them."""
        b = self.reserve(x, x.shape[2])
        b.narrow(2, self.length, x.shape[2]).copy_(x)  # (narrow: one view operator where indexing takes three)
        self.length += x.shape[2]
        return b.narrow(2, 0, self.length)


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose ``keys`` / ``values`` are views of `_Growing` buffers: the same interface (HF's layers,
    `KVState`'s prune, crop and fork read and assign them as before), appends without re-copying the cache."""

    def __init__(self, **kwargs) -> None:
        self._k, self._v = _Growing(), _Growing()
        super().__init__(**kwargs)

    keys = property(lambda self: self._empty_or(self._k.view()), lambda self, value: self._k.assign(value))
    values = property(lambda self: self._empty_or(self._v.view()), lambda self, value: self._v.assign(value))

    def _empty_or(self, view: torch.Tensor | None) -> torch.Tensor | None:
        """An initialized layer with no slots reads as an empty tensor, as `DynamicLayer`'s does."""
        if view is None and self.is_initialized:
            return torch.empty(0, dtype=getattr(self, "dtype", None), device=getattr(self, "device", None))
        return view

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self._k.assign(None)
        self._v.assign(None)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return self._k.append(key_states), self._v.append(value_states)

    def reserve(self, like: torch.Tensor, n: int, capacity: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers with room for ``n`` more slots of ``like``'s form (`_Growing.reserve`), for a
        caller that writes them itself (`models.compiled_stack`) and then calls `advance`."""
        if not self.is_initialized:
            self.lazy_initialization(like, like)
        return self._k.reserve(like, n, capacity), self._v.reserve(like, n, capacity)

    def advance(self, n: int) -> None:
        """``n`` more slots in use, written after the old ones into the buffers `reserve` returned."""
        self._k.length += n
        self._v.length += n

    def keep_first(self, length: int) -> None:
        """Keep the first ``length`` slots, `KVState.crop`'s cut: the buffers stay, only their used length shrinks
        (no view built and assigned back: ~1 us a layer instead of ~15). HF's own ``crop``, whose argument changed
        meaning across transformers versions, is inherited unchanged."""
        for grow in (self._k, self._v):
            grow.length = min(grow.length, length)


def growing_cache() -> DynamicCache:
    """An empty `DynamicCache` whose layers are `GrowingLayer` s (created at their first update)."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    return cache


class KVState:
    """One model's KV cache and the position of each slot (kept on the CPU as a Python list)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.cache = growing_cache()
        self.positions: list[int] = []  # [S] position id of each slot
        self.device = model_device(model)
        self.dtype = model_dtype(model)
        self._kwarg = cache_kwarg(model)
        self._keeps = takes_logits_to_keep(model)

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def keeps_logits(self) -> bool:
        """Whether the model's head skips the positions ``forward``'s ``last_logits`` / ``logits_rows`` leave out
        (then its logits hold only the kept rows); otherwise they cover every position."""
        return self._keeps

    def forward(self, input_ids: torch.Tensor, position_ids: list[int], attention_mask,
                output_hidden_states: bool = False, last_logits: int = 0, logits_rows: list[int] | None = None):
        """Run the model on ``input_ids`` ``[n]`` appended after the cached slots; returns the HF output.

        ``attention_mask`` is an additive float mask ``[1, 1, n, S + n]`` (or a dict of them per layer
        type) built by `engine.tree_pass`. ``last_logits > 0``: the output's logits cover only
        the last ``last_logits`` positions; ``logits_rows``: only those positions, in that order (in both
        cases where `keeps_logits`: the head is skipped elsewhere)."""
        pos = torch.tensor(position_ids, dtype=torch.long, device=self.device)[None]  # [1, n]
        kwargs = {self._kwarg: self.cache}
        if self._keeps and logits_rows is not None:
            kwargs["logits_to_keep"] = torch.tensor(logits_rows, dtype=torch.long, device=self.device)
        elif last_logits and self._keeps:
            kwargs["logits_to_keep"] = last_logits
        out = self.model(input_ids=input_ids[None], attention_mask=attention_mask, position_ids=pos,
                         use_cache=True, output_hidden_states=output_hidden_states, **kwargs)
        self.positions.extend(position_ids)
        if self.cache.get_seq_length() != len(self.positions):
            raise RuntimeError(
                f"KV cache holds {self.cache.get_seq_length()} slots after a forward pass, expected "
                f"{len(self.positions)}: the model did not update the cache it was given in place "
                "(a sliding-window or static cache?). The engine needs a plain DynamicCache.")
        return out

    def keep(self, start: int, slots: list[int]) -> None:
        """Keep slots ``[0, start)`` and then ``slots`` (in that order, each > its predecessor), drop the
        rest: the accepted path of a tree moves to contiguous slots ``start, start + 1, ...``."""
        m = len(slots)
        # skip the prefix of slots that is already in place
        j = 0
        while j < m and slots[j] == start + j:
            j += 1
        new_len = start + m
        if j < m:
            src = torch.tensor(slots[j:], dtype=torch.long, device=self.device)
            dst0 = start + j
            for layer in self.cache.layers:
                if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
                    continue
                # advanced indexing copies first, so overlapping source/destination slots are safe; a
                # target split over GPUs (model.device_map) keeps each layer's cache on its own device
                idx = src if src.device == layer.keys.device else src.to(layer.keys.device)
                layer.keys[:, :, dst0:new_len] = layer.keys[:, :, idx]
                layer.values[:, :, dst0:new_len] = layer.values[:, :, idx]
        self.crop(new_len, _positions=[self.positions[s] for s in slots])

    def fork(self, length: int) -> KVState:
        """A new state holding a copy of the first ``length`` slots (this one is left untouched).

        The collection stage prefills a whole trajectory once and forks the prefix of every root."""
        if not 0 <= length <= len(self.positions):
            raise ValueError(f"cannot fork {length} slots of a KV cache of {len(self.positions)}")
        other = KVState(self.model)
        for idx, layer in enumerate(self.cache.layers):
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            other.cache.update(layer.keys[:, :, :length], layer.values[:, :, :length], idx)
        other.positions = self.positions[:length]
        return other

    def crop(self, length: int, _positions: list[int] | None = None) -> None:
        """Drop every slot from ``length`` on (``_positions`` replaces the kept tail's positions)."""
        if length > len(self.positions):
            raise ValueError(f"cannot crop a KV cache of {len(self.positions)} slots to {length}")
        for layer in self.cache.layers:
            if isinstance(layer, GrowingLayer):
                layer.keep_first(length)
                continue
            if getattr(layer, "is_sliding", False):
                raise ValueError("the engine does not support sliding-window cache layers; "
                                 "pass a DynamicCache without config")
            if getattr(layer, "keys", None) is not None and layer.keys.numel() > 0:
                layer.keys = layer.keys[:, :, :length]
                layer.values = layer.values[:, :, :length]
        if _positions is not None:
            start = length - len(_positions)
            self.positions[start:] = _positions
        del self.positions[length:]
