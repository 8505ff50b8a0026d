"""Online calibration of the latency model: the decoder's measured step times correct ``T(c, a)`` as it runs.

Why: the profile times the machine once, and a shared VM drifts. On the 2-core CPU of the default pair a plain
step was profiled at 21.5 ms and measured at 36.8 ms an hour later; in the same minutes a 2,0,1 step, priced at
27.2 ms, took 50.9 ms. The profile's fitted step overhead (-10 ms: its whole-step decodes ran faster than its
grid) had gone stale too. A selector that prices with the stale profile speculates where it no longer pays.

What: the latency model splits a step's price into the draft's forwards ``D``, the target's pass ``P`` and the
rest ``R = T - D - P`` (step overhead, features, the selector's forward; `LatencyModel.step_parts_at`). The
decoder measures the same parts of every step (`decoding.policy.StepTiming`). The calibration keeps, with a
half-life of ``half_life`` steps,
- a factor per forward kind: decayed sum of measured draft (target) seconds over the decayed sum of modelled
  ones, from every step that ran that kind of forward. A plain step's price is mostly its one-token target
  pass, so the target factor learned from speculative steps prices the plain step too, even when the selector
  never declines (a calibration by step class alone never sees a plain step then: the first try of this
  module did exactly that, and its factor told the selector nothing);
- a shift per step class (plain, speculative): the decayed mean of measured minus modelled rest. A class not
  yet observed borrows the other's; with no observation at all the price is the profile's.
The calibrated price of an output is ``f_draft * D + f_target * P + R + shift[class]``. Ratios of sums, because
throughput pays the mean step time; each step's measured part is clipped to ``[1 / max_factor, max_factor]``
times its modelled one (and the rest to within ``max_factor`` times the modelled step of it), so one step
stalled by the OS cannot swing a decision far. A step whose draft caught up on more than
``max_catch_up`` tokens (a decode's first speculative step, which prefills the draft with the prompt) is not
observed.

Lossless: the corrections come only from the wall times of finished steps, never from the draws of the step
being decided, so the shape is still fixed before its tree is drawn (ALGORITHMS.md section 7 holds as for any
selector). It does make a decode's choices, and so its tokens, depend on the machine's speed: a run is
reproducible with the calibration off.

Numpy only (the torch-free runtime imports it): `export.runtime.SelectorRuntime` applies it when created with
``calibrate=True``; the decoder reports each step through the policy's ``observe_step`` hook
(`decoding.engine.generate`).
"""

from __future__ import annotations

import math

import numpy as np

from .policy import StepTiming

CLASSES = ("plain", "speculative")
FORWARDS = ("draft", "target")


class OnlineCalibration:
    """Measured / modelled factors of the draft's and the target's forwards, and a shift of the rest of a step per
    step class (module docstring)."""

    def __init__(self, half_life: float = 64.0, max_factor: float = 4.0, max_catch_up: int = 8) -> None:
        if not (half_life > 0 and math.isfinite(half_life)) or not max_factor >= 1 or max_catch_up < 1:
            raise ValueError(f"OnlineCalibration needs half_life > 0, max_factor >= 1 and max_catch_up >= 1, got "
                             f"{half_life}, {max_factor} and {max_catch_up}")
        self.half_life, self.max_factor, self.max_catch_up = float(half_life), float(max_factor), int(max_catch_up)
        self.decay = 0.5 ** (1.0 / self.half_life)  # per observed step
        self.reset()

    def reset(self) -> None:
        """Forget every observation (the profile's prices again)."""
        self._measured = dict.fromkeys(FORWARDS, 0.0)  # forward kind -> decayed sum of measured seconds
        self._modelled = dict.fromkeys(FORWARDS, 0.0)  # forward kind -> decayed sum of modelled seconds
        self._shift = dict.fromkeys(CLASSES, 0.0)  # class -> decayed sum of (measured - modelled) rest
        self._weight = dict.fromkeys(CLASSES, 0.0)  # class -> decayed count
        self.steps = dict.fromkeys(CLASSES, 0)

    def observe(self, speculative: bool, timing: StepTiming, draft: float, target: float, total: float) -> None:
        """One finished step: what it cost (``timing``) and its modelled parts (seconds: the draft's forwards, the
        target's pass, the whole step). Steps with non-finite or non-positive times, or a draft catch-up longer
        than ``max_catch_up`` tokens, are ignored."""
        values = (timing.seconds, timing.draft_seconds, timing.target_seconds, draft, target, total)
        if not all(math.isfinite(v) for v in values) or timing.seconds <= 0 or target <= 0 or total <= 0:
            return
        if timing.draft_catch_up > self.max_catch_up:
            return
        lo, hi = 1.0 / self.max_factor, self.max_factor
        for kind, measured, modelled in (("draft", timing.draft_seconds, draft),
                                         ("target", timing.target_seconds, target)):
            self._measured[kind] *= self.decay
            self._modelled[kind] *= self.decay
            if modelled > 0:
                self._measured[kind] += min(max(measured, lo * modelled), hi * modelled)
                self._modelled[kind] += modelled
        c = CLASSES[bool(speculative)]
        bound = self.max_factor * total
        diff = min(max(timing.rest_seconds - (total - draft - target), -bound), bound)
        self._shift[c] = self.decay * self._shift[c] + diff
        self._weight[c] = self.decay * self._weight[c] + 1.0
        self.steps[c] += 1

    def factor(self, kind: str) -> float:
        """The multiplier of the modelled seconds of the ``kind`` forwards ("draft" or "target")."""
        return self._measured[kind] / self._modelled[kind] if self._modelled[kind] > 0 else 1.0

    def shift(self, speculative: bool) -> float:
        """Seconds added to the modelled rest of a step of this class."""
        for c in (CLASSES[bool(speculative)], CLASSES[not speculative]):
            if self._weight[c] > 0:
                return self._shift[c] / self._weight[c]
        return 0.0

    def price(self, draft: np.ndarray, target: np.ndarray, total: np.ndarray, speculative: np.ndarray) -> np.ndarray:
        """``[A]`` calibrated seconds of outputs with these modelled parts (``[A]`` each) and classes (bool)."""
        rest = np.asarray(total) - np.asarray(draft) - np.asarray(target)
        shift = np.where(np.asarray(speculative, dtype=bool), self.shift(True), self.shift(False))
        return self.factor("draft") * np.asarray(draft) + self.factor("target") * np.asarray(target) + rest + shift

    def to_dict(self) -> dict:
        return {"half_life": self.half_life, "steps": dict(self.steps),
                "factors": {k: self.factor(k) for k in FORWARDS},
                "rest_shift_ms": {c: 1e3 * self.shift(c == "speculative") for c in CLASSES}}

    def __repr__(self) -> str:
        return (f"OnlineCalibration(draft x{self.factor('draft'):.3f}, target x{self.factor('target'):.3f}, "
                f"rest {1e3 * self.shift(False):+.1f} ms plain / {1e3 * self.shift(True):+.1f} ms speculative, "
                f"steps {self.steps})")
