"""Per-run statistics of the decode loop.

- *block efficiency* (= mean acceptance length, vLLM; = compression ratio, EAGLE): tokens produced per
  target pass, i.e. mean over steps of (accepted draft tokens + 1). Counted before truncation at EOS or
  ``max_new_tokens``, so it measures the method, not where the run happened to stop.
- *per-depth acceptance*: at depth d, among steps whose tree had a node at depth d and that accepted
  d - 1 draft tokens (the verifier reached depth d - 1), the fraction that accepted at least d.
- *accepted-length histogram*: ``hist[a]`` = steps that accepted exactly a draft tokens.
- time split (seconds): draft (drafting incl. feeding the root to the draft), target (tree passes and
  prefill), verification, selector; ``other`` is the rest (cache pruning, bookkeeping); ``prefill``: the target's
  prefill and the draft's first forward over the prompt (already counted in draft and target).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch


@dataclass
class DecodeStats:
    method: str
    steps: int = 0  # target passes after the prefill
    new_tokens: int = 0  # tokens returned (after truncation)
    emitted: int = 0  # tokens produced by the steps (before truncation)
    accepted_hist: list[int] = field(default_factory=list)  # [a] steps with a accepted draft tokens
    depth_offered: list[int] = field(default_factory=list)  # [d] steps that tested depth d
    depth_accepted: list[int] = field(default_factory=list)  # [d] steps that accepted depth d
    classes: Counter = field(default_factory=Counter)  # step class (`decoding.pricing.step_class`) -> steps
    methods: Counter = field(default_factory=Counter)  # verification method -> steps that drafted a tree
    time_draft: float = 0.0
    time_target: float = 0.0
    time_verify: float = 0.0
    time_selector: float = 0.0
    time_prefill: float = 0.0  # the target's prefill and the draft's first forward over the prompt (in the above)
    time_total: float = 0.0

    def record_step(self, tree_depth: int, num_accepted: int, klass: str, method: str | None = None) -> None:
        self.steps += 1
        self.emitted += num_accepted + 1
        self.classes[klass] += 1
        if method is not None:
            self.methods[method] += 1
        while len(self.accepted_hist) <= num_accepted:
            self.accepted_hist.append(0)
        self.accepted_hist[num_accepted] += 1
        while len(self.depth_offered) <= tree_depth:
            self.depth_offered.append(0)
            self.depth_accepted.append(0)
        for d in range(1, min(tree_depth, num_accepted + 1) + 1):
            self.depth_offered[d] += 1
            if num_accepted >= d:
                self.depth_accepted[d] += 1

    @property
    def block_efficiency(self) -> float:
        return self.emitted / self.steps if self.steps else float("nan")

    @property
    def decode_seconds(self) -> float:
        """Seconds after the prompt's prefill: the steps alone (what step prices and offline estimates describe)."""
        return self.time_total - self.time_prefill

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.time_total if self.time_total > 0 else float("nan")

    @property
    def per_depth_acceptance(self) -> list[float]:
        """Index d - 1 holds the acceptance rate at depth d (NaN if never tested)."""
        return [a / o if o else float("nan") for a, o in zip(self.depth_accepted[1:], self.depth_offered[1:], strict=True)]

    def to_dict(self) -> dict:
        other = self.time_total - self.time_draft - self.time_target - self.time_verify - self.time_selector
        return {
            "method": self.method,
            "steps": self.steps,
            "new_tokens": self.new_tokens,
            "block_efficiency": self.block_efficiency,
            "tokens_per_second": self.tokens_per_second,
            "per_depth_acceptance": self.per_depth_acceptance,
            "accepted_hist": list(self.accepted_hist),
            "classes": dict(self.classes),
            "methods": dict(self.methods),
            "time_s": {"draft": self.time_draft, "target": self.time_target, "verify": self.time_verify,
                       "selector": self.time_selector, "other": other, "total": self.time_total,
                       "prefill": self.time_prefill},
        }

    def summary(self) -> str:
        d = self.to_dict()
        t = d["time_s"]
        depth = " ".join(f"{x:.2f}" for x in d["per_depth_acceptance"]) or "-"
        return (f"method {self.method}: {self.new_tokens} tokens in {self.steps} target passes, "
                f"block efficiency {self.block_efficiency:.3f}, {self.tokens_per_second:.1f} tokens/s\n"
                f"  per-depth acceptance: {depth}\n"
                f"  accepted-length histogram: {d['accepted_hist']}\n"
                f"  time (s): draft {t['draft']:.3f}, target {t['target']:.3f}, verify {t['verify']:.3f}, "
                f"selector {t['selector']:.3f}, other {t['other']:.3f}, total {t['total']:.3f}")


class Timer:
    """Accumulates wall time into a stats field; synchronizes CUDA so GPU work is charged correctly."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.t = time.perf_counter()

    def now(self) -> float:
        """The current time (after the device's queued work), without starting a new lap."""
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self) -> float:
        now = self.now()
        dt, self.t = now - self.t, now
        return dt
