"""Where and in what precision a model is placed: the names a config may use, checked without torch.

`pipeline.sections.ModelConfig` validates ``model.dtype`` and ``model.device_map`` with these (config validation
imports neither torch nor numba); `models/loading.py` turns the same names into torch dtypes and accelerate
placements.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from decoding.errors import UserInputError

DTYPE_NAMES = ("float32", "float16", "bfloat16")  # model.dtype values; loading.resolve_dtype maps them to torch
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's placement strategies
# how a target's linear layers compute (models.quantized): dense float weights, or a GGUF file's own 4-bit blocks
# with bfloat16 activations (int4); auto = int4 for a GGUF target on CPU in float32, else dense
BACKENDS = ("auto", "dense", "int4")


class ModelLoadError(UserInputError):
    """A model or tokenizer could not be loaded; the message says which and why."""


@dataclass(frozen=True)
class Placement:
    """How a model is laid out beyond its device and dtype: accelerate's ``device_map`` and the ``backend``."""

    device_map: str | None = None
    backend: str = "dense"
    compile: bool = False  # a decoder stack on GGUF blocks as one compiled graph (models.compiled_stack)

    def check(self) -> None:
        check_device_map(self.device_map)
        if self.backend not in BACKENDS:
            raise ModelLoadError(f"unknown model backend {self.backend!r}; use one of {list(BACKENDS)}")


def check_dtype_name(dtype: str) -> None:
    if dtype not in DTYPE_NAMES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_NAMES)}")


def check_device_map(device_map: str | None) -> None:
    """A known placement strategy, and not under a multi-process torchrun (where every rank would
    spread its copy over the same GPUs)."""
    if device_map is None:
        return
    if device_map not in DEVICE_MAPS:
        raise ModelLoadError(f"unknown device_map {device_map!r}; use null (the whole model on `device`) "
                             f"or one of {list(DEVICE_MAPS)}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "LOCAL_RANK" in os.environ:
        raise ModelLoadError(f"device_map={device_map!r} spreads one model over every visible GPU, so torchrun's "
                             "ranks would all claim the same GPUs; run one process per model copy with its own "
                             "CUDA_VISIBLE_DEVICES and --shard i/N instead (README, multi-GPU recipe)")
