"""Section `profile` of params.yaml: `ProfileConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ProfileConfig:
    """Latency profile (stage profile): the grid the latency model T(c, a) interpolates (decoding/latency.py)."""

    contexts: list[int] = field(default_factory=lambda: [64, 256, 512, 1024])  # context lengths, ascending
    draft_rows: list[int] = field(default_factory=lambda: [1, 2, 3, 4])  # draft query rows: 1..max K
    # target tree-pass tokens (root included): every single tree of the CPU action grid (up to 13 tokens)
    # and the union trees of the labels (up to 40)
    target_tokens: list[int] = field(default_factory=lambda: [*range(1, 17), 20, 24, 32, 40])
    repeats: int = 5  # timed rounds per grid cell (the profile holds their mean)
    warmup: int = 2  # untimed rounds first (with 1 the first context's draft steps read 40% slow)
    feature_repeats: int = 200  # timed runs of deciding's features per feature set (quietest of 5 blocks)
    # whole decoded steps as ratios to plain steps of the same interleaved rounds (data_collection.step_prices; what
    # decoding/pricing.py prices with): rounds (0 = the tables alone price steps), tokens per decode, the context
    # lengths the rounds decode from (cycled), and the lookup chain lengths measured
    price_rounds: int = 4
    price_tokens: int = 16
    price_contexts: list[int] = field(default_factory=lambda: [128, 384])
    lookup_lengths: list[int] = field(default_factory=lambda: list(range(1, 9)))
    # timed verify calls per (method, shape of the action grid) on trees of the pair's own rows (the mean is kept:
    # data_collection.verify_cost); the step overhead is Traversal's, so this prices the other methods; 0 = none
    verify_repeats: int = 5
    out: str = "artifacts/latency.json"

    def validate(self) -> None:
        for name, first in (("contexts", None), ("draft_rows", 1), ("target_tokens", 1)):
            values = getattr(self, name)
            if not values or any(b <= a for a, b in zip(values, values[1:], strict=False)) or min(values) < 1:
                raise ValueError(f"{name} must be a non-empty strictly ascending list of ints >= 1, not {values}")
            if first is not None and values[0] != first:
                raise ValueError(f"{name} must start at {first} (the latency model needs it), not {values}")
        if self.price_rounds < 0 or self.verify_repeats < 0 or self.price_tokens < 1:
            raise ValueError(f"price_rounds and verify_repeats must be >= 0 and price_tokens >= 1, not "
                             f"{self.price_rounds}, {self.verify_repeats} and {self.price_tokens}")
        if not self.price_contexts or min(self.price_contexts) < 2 or any(n < 1 for n in self.lookup_lengths):
            raise ValueError(f"price_contexts must be context lengths >= 2 and lookup_lengths >= 1, not "
                             f"{self.price_contexts} and {self.lookup_lengths}")
        if self.lookup_lengths and max(self.lookup_lengths) + 1 > self.target_tokens[-1]:
            raise ValueError(f"a lookup chain of {max(self.lookup_lengths)} tokens is a target pass of "
                             f"{max(self.lookup_lengths) + 1}: extend target_tokens (up to {self.target_tokens[-1]})")
        if self.repeats < 1 or self.warmup < 0 or self.feature_repeats < 1:
            raise ValueError(f"repeats and feature_repeats must be >= 1 and warmup >= 0, not "
                             f"{self.repeats}, {self.feature_repeats}, {self.warmup}")
