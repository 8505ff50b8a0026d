"""Online calibration of the latency model: the decoder's measured step times correct ``T(c, a)`` as it runs.

Why: the profile times the machine once, and a shared VM drifts. On the 2-core CPU of the default pair a
plain step was profiled at 26 ms and measured at 39 ms in the evaluation half an hour later, and in that slow
phase the speculative steps lost more than the plain ones (static 2,0,1 read 1.20x autoregressive offline,
1.05x online). A selector that prices with the stale profile keeps speculating where it no longer pays.

What: steps are split in two classes, *plain* (no tree) and *speculative* (a tree). For each class the
calibration keeps exponentially weighted sums of the measured and the modelled seconds of the steps it was
told about (`observe`), with a half-life of ``half_life`` steps, and its factor is their ratio: a ratio of
means, because throughput pays the mean step time (one slow step in ten costs 30-40% more on this CPU). A
class not yet observed borrows the other class's factor (a machine that slowed down slowed both); with no
observation at all both factors are 1 (the profile as it is). Each ratio is clipped to ``[1 / max_factor,
max_factor]``, so one step stalled by the OS cannot swing a decision far.

Lossless: the factors depend only on the wall times of finished steps, never on the draws of the step being
decided, so the shape is still fixed before its tree is drawn (ALGORITHMS.md section 7 holds as for any
selector). It does make a decode's choices, and so its tokens, depend on the machine's speed: a run is
reproducible with the calibration off.

Numpy only (the torch-free runtime imports it): `export.runtime.SelectorRuntime` applies it when created
with ``calibrate=True``; the decoder reports each step through the policy's ``observe_step`` hook
(`decoding.engine.generate`).
"""

from __future__ import annotations

import math

import numpy as np

CLASSES = ("plain", "speculative")


class OnlineCalibration:
    """Measured / modelled step-time factors of plain and speculative steps (module docstring)."""

    def __init__(self, half_life: float = 64.0, max_factor: float = 4.0) -> None:
        if not (half_life > 0 and math.isfinite(half_life)) or not max_factor >= 1:
            raise ValueError(f"OnlineCalibration needs half_life > 0 and max_factor >= 1, got {half_life} and "
                             f"{max_factor}")
        self.half_life, self.max_factor = float(half_life), float(max_factor)
        self.decay = 0.5 ** (1.0 / self.half_life)  # per observed step of the same class
        self.reset()

    def reset(self) -> None:
        """Forget every observation (both factors back to 1)."""
        self._measured = dict.fromkeys(CLASSES, 0.0)  # class -> decayed sum of measured seconds
        self._modelled = dict.fromkeys(CLASSES, 0.0)  # class -> decayed sum of modelled seconds
        self.steps = dict.fromkeys(CLASSES, 0)

    def observe(self, speculative: bool, measured_seconds: float, modelled_seconds: float) -> None:
        """One finished step: what it took and what the latency model priced it at (both > 0; others ignored)."""
        if not (measured_seconds > 0 and modelled_seconds > 0 and math.isfinite(measured_seconds)
                and math.isfinite(modelled_seconds)):
            return
        c = CLASSES[bool(speculative)]
        ratio = min(max(measured_seconds / modelled_seconds, 1.0 / self.max_factor), self.max_factor)
        self._measured[c] = self.decay * self._measured[c] + ratio * modelled_seconds
        self._modelled[c] = self.decay * self._modelled[c] + modelled_seconds
        self.steps[c] += 1

    def factor(self, speculative: bool) -> float:
        """The multiplier of the modelled seconds of a step of this class."""
        own, other = CLASSES[bool(speculative)], CLASSES[not speculative]
        for c in (own, other):
            if self._modelled[c] > 0:
                return self._measured[c] / self._modelled[c]
        return 1.0

    def factors(self, speculative: np.ndarray) -> np.ndarray:
        """``[A]`` multipliers for outputs whose class is given by the bool mask ``speculative`` ``[A]``."""
        return np.where(np.asarray(speculative, dtype=bool), self.factor(True), self.factor(False))

    def to_dict(self) -> dict:
        return {"half_life": self.half_life, "steps": dict(self.steps),
                "factors": {c: self.factor(c == "speculative") for c in CLASSES}}

    def __repr__(self) -> str:
        return (f"OnlineCalibration(plain x{self.factor(False):.3f}, speculative x{self.factor(True):.3f}, "
                f"steps {self.steps})")
