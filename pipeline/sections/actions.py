"""Section `actions` of params.yaml: `ActionsConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ActionsConfig:
    """The action grid (`decoding.actions.ActionSpace`) that every stage uses: inclusive [min, max] ranges.

    The CPU default (48 actions) keeps one root's union tree at 39 nodes; the paper's grid (K 1-4, L1 0-8,
    L2 0-8, 324 actions) is the preset configs/paper-grid.yaml."""

    K: list[int] = field(default_factory=lambda: [1, 3])  # rollouts at the branch node
    L1: list[int] = field(default_factory=lambda: [0, 3])  # trunk length
    L2: list[int] = field(default_factory=lambda: [0, 3])  # rollout length

    def space(self):
        from decoding.actions import ActionSpace

        return ActionSpace.from_config({"K": self.K, "L1": self.L1, "L2": self.L2})

    def validate(self) -> None:
        for name in ("K", "L1", "L2"):
            v = getattr(self, name)
            if len(v) != 2 or v[0] > v[1]:
                raise ValueError(f"{name} must be [min, max] with min <= max, not {v}")
        self.space()
