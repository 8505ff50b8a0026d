"""Section `sampling` of params.yaml: `SamplingConfig`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingConfig:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]

    def validate(self) -> None:
        from decoding.sampling import Sampling

        Sampling(self.temperature, self.top_p)
