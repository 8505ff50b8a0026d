"""Policies: how the decoder picks the action of each step.

A policy is either a static `Action` (the same tree shape every step) or a *selector*: any object with

    select(features: RootFeatures) -> Action

and, optionally, the attribute ``needs_hidden_states = True`` when it reads the hidden-state fields of
`RootFeatures` (they cost an ``output_hidden_states`` pass; the probability rows are always filled).
This is the whole protocol: the ONNX selector (export/) and any heuristic implement it the same way.

The features are those of ALGORITHMS.md section 5, in raw form: everything is available at the root
without an extra target pass (the *root* is the last emitted token, not yet seen by the target; "prev"
is the token before it). Turning them into the selector's input vector (entropies, KL, latencies) is
the feature module's job, not the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from ..actions import Action
from ..sampling import Sampling


@dataclass
class RootFeatures:
    """What a selector may look at when choosing the action of a step."""

    context_length: int  # tokens before the root (prompt + emitted so far, root excluded)
    sampling: Sampling
    q_root: np.ndarray  # [V] q(.|context + root), transformed
    q_prev: np.ndarray | None  # [V] q(.|context): draft row at the token before the root
    p_prev: np.ndarray | None  # [V] p(.|context): target row from the last target pass
    h_q_root: torch.Tensor | None = None  # [H_q] draft last-layer hidden state at the root
    h_q_prev: torch.Tensor | None = None  # [H_q] ... at the token before the root
    h_p_prev: torch.Tensor | None = None  # [H_p] target last-layer hidden state at the token before the root


@runtime_checkable
class Selector(Protocol):
    """Chooses an action at each root (see module docstring)."""

    def select(self, features: RootFeatures) -> Action: ...


class StaticPolicy:
    """The same action at every step (a selector that ignores its features)."""

    needs_hidden_states = False

    def __init__(self, action: Action) -> None:
        self.action = action

    def select(self, features: RootFeatures) -> Action:
        return self.action

    def __repr__(self) -> str:
        return f"StaticPolicy({self.action})"


def as_policy(policy: Action | Selector) -> Action | Selector:
    """Validate ``policy``: an `Action` (static) or an object with a ``select`` method."""
    if isinstance(policy, Action):
        return policy
    if callable(getattr(policy, "select", None)):
        return policy
    raise TypeError(f"policy must be an Action or a selector with select(features) -> Action, "
                    f"got {type(policy).__name__}")
