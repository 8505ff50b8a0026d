"""Where and in what precision a model is placed: the names a config may use, checked without torch.

`pipeline/sections/model.py` validates ``model.dtype`` and ``model.device_map`` with these (config validation
imports neither torch nor numba); `models/loading.py` turns the same names into torch dtypes and accelerate
placements.
"""

from __future__ import annotations

import os

from decoding.errors import UserInputError

DTYPE_NAMES = ("float32", "float16", "bfloat16")  # model.dtype values; loading.resolve_dtype maps them to torch
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's placement strategies


class ModelLoadError(UserInputError):
    """A model or tokenizer could not be loaded; the message says which and why."""


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
