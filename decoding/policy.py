"""The policy protocol: how the decoder asks what to do at each step (numpy only, no torch).

A *policy* decides, at every root, the step's tree: a static `Action` (the same shape every step) is wrapped in
`StaticPolicy`; everything else subclasses `Policy`, the way transformers' candidate generators subclass
``CandidateGenerator``. The decoder (`engine.decoder`) calls only what `Policy` declares:

- ``select(features: RootFeatures) -> Action | Choice``: the step's action, and optionally its verification
  method and a tree the policy proposes instead of the draft's (`Choice`);
- what the policy needs computed before ``select``: ``needs_hidden_states`` (the ``h_*`` fields: an
  ``output_hidden_states`` pass), ``needs_draft`` (the draft's root step first, so ``q_root`` / ``q_prev`` are
  filled; a policy that reads target-side features only sets it False, and then declining to speculate is exactly
  one plain target step) and ``uses_draft_model`` (False: the policy never drafts with the model, so a decoder
  without a draft model can run it);
- ``observe(step: StepResult)``: told after every step what it did and cost; ``reset()``: a new decode starts.
  Both are no-ops by default.

A `Choice` is either a shape for the engine to draft (its drafting service) or a tree the policy built itself, so
the engine needs no knowledge of any concrete policy:
- ``action`` alone: the engine drafts that action's tree;
- ``proposal``: a `decoding.tree.DraftTree` with its q rows (e.g. `decoding.tree.proposal_tree`: a chain with one-hot
  rows, which prompt lookup builds from the context); the decoder verifies it as it is, with no draft forward;
- ``stop_after``: the engine drafts the chain ``(1, L1, 0)`` token by token and stops after the token drawn from a
  q row for which ``stop_after(row)`` is true (the dynamic chain of `policies.threshold_chain`).

`RootFeatures` holds the raw features of ALGORITHMS.md section 5 (the *root* is the last emitted token, not yet seen
by the target; "prev" is the token before it). Turning them into the selector's input vector is
`decoding.features`' job. The ONNX runtime (`export/runtime.py`) implements this protocol like any heuristic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .actions import Action
from .features import RootFeatures  # re-exported: the raw features live with the feature schema
from .tree import DraftTree


@dataclass(frozen=True)
class Choice:
    """An action and, optionally, the verification method of this step (None: the decoder's), a ``proposal`` (the
    policy's own tree of shape ``action``, verified without drafting) or ``stop_after`` (draft the chain ``action``
    token by token and stop after the token drawn from a row where it returns True). A proposal and a stop rule
    exclude each other; the decoder checks the Choice a policy returns (`engine.decoder._as_choice`)."""

    action: Action
    method: str | None = None
    proposal: DraftTree | None = None
    stop_after: Callable[[np.ndarray], bool] | None = None


@dataclass(frozen=True)
class StepTiming:
    """What one finished step cost, as the decoder measured it (seconds)."""

    seconds: float  # the whole step: choosing, drafting, the target pass, verification, pruning
    draft_seconds: float  # the draft's forwards (its root step and the tree); 0 for a plain step
    target_seconds: float  # the target's tree pass, with the transform of its rows
    draft_prefill_seconds: float = 0.0  # the draft's first forward over the prompt (inside draft_seconds), else 0
    choose_seconds: float = 0.0  # step 1 after the draft's root step: the features and ``select`` (0: static)

    @property
    def step_seconds(self) -> float:
        """The step without the draft's prompt prefill: what the latency model prices (`decoding.pricing`)."""
        return self.seconds - self.draft_prefill_seconds


@dataclass
class StepResult:
    """One finished step: what a policy's ``observe`` is told and ``generate``'s result lists (features dropped)."""

    action: Action  # the realized shape (a stop rule's chain as drafted)
    method: str | None  # the verification method of this step (None for an empty tree)
    tokens: list[int]  # accepted draft tokens, then the emitted token
    features: RootFeatures | None  # what the policy saw (None for a static policy)
    context_length: int = 0  # tokens before the step's root
    timing: StepTiming | None = None
    proposed: bool = False  # the tree was the policy's own (`Choice.proposal`), not drafted
    selected: bool = False  # the policy's ``select`` ran at this step (a static policy's never does)


class Policy:
    """Base class of every policy (module docstring): ``select`` is required, the rest has defaults."""

    needs_hidden_states: bool = False
    needs_draft: bool = True
    uses_draft_model: bool = True
    fixed_action: Action | None = None  # the action of every step, known without features (`StaticPolicy`)

    def select(self, features: RootFeatures) -> Action | Choice:
        raise NotImplementedError(f"{type(self).__name__} must implement select(features)")

    def observe(self, step: StepResult) -> None:
        """Told after every step (what it did and cost); no-op by default."""

    def reset(self) -> None:
        """A new decode starts; no-op by default."""


class StaticPolicy(Policy):
    """The same action at every step (it reads no features and costs nothing)."""

    needs_draft = False

    def __init__(self, action: Action) -> None:
        self.action = self.fixed_action = action
        self.uses_draft_model = action.tree_size > 0

    def select(self, features: RootFeatures) -> Action:
        return self.action

    def __repr__(self) -> str:
        return f"StaticPolicy({self.action})"


def as_policy(policy: Action | Policy) -> Policy:
    """``policy`` as a `Policy`: an `Action` becomes a `StaticPolicy`."""
    if isinstance(policy, Action):
        return StaticPolicy(policy)
    if isinstance(policy, Policy):
        return policy
    raise TypeError(f"policy must be an Action or a decoding.policy.Policy, got {type(policy).__name__}")
