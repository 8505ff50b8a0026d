"""The selector protocol: how the decoder asks for the action of each step (numpy only, no torch).

A *policy* is a static `Action` (the same tree shape every step) or a *selector*: any object with

    select(features: RootFeatures) -> Action | Choice

(a `Choice` also names the verification method of the step: a selector trained with ``method: auto``
picks both; every method is lossless and the choice is made before drafting) and two optional attributes that tell the engine what to compute before calling it:
- ``needs_hidden_states`` (default False): fill the ``h_*`` fields (an ``output_hidden_states`` pass);
- ``needs_draft`` (default True): run the draft's root step first, so ``q_root`` / ``q_prev`` are filled.
  A selector that reads only target-side features sets it False: when it then declines to speculate
  (an action with an empty tree) the step is exactly one plain target step, and the draft catches up
  on the skipped tokens only when a later step drafts a tree.
- ``refine(features) -> Action | Choice`` (optional, `Cascade`): when ``select`` (without the draft's features)
  drafts a tree, the decoder runs the draft's root step and takes ``refine``'s answer instead.
- ``draft_tree(...)`` (optional, `decoding.threshold_chain.ThresholdChain`): drafts the step's tree itself (a
  tree whose shape follows the draft's own rows); the step records the drafted tree's action.
- ``uses_draft_model`` (default True): False lets a decoder without a draft model run the policy (it only takes plain
  steps and proposed chains).
- a `Choice` with a ``proposal`` (`decoding.lookup.LookupFirst`): the step verifies that chain of context tokens
  (one-hot q rows, no draft forward); the selector reads the context from ``RootFeatures.context``.
- ``observe_step(action, context_length, timing: StepTiming)`` (optional, `export.runtime.SelectorRuntime` with
  ``calibrate``): told after every step what it cost (`decoding.calibration` corrects the latency model with it).

This module is the whole protocol: the ONNX runtime (`export/runtime.py`), trained selectors and any
heuristic implement it the same way. `RootFeatures` holds the raw features of ALGORITHMS.md section 5,
all available at the root without an extra target pass (the *root* is the last emitted token, not yet
seen by the target; "prev" is the token before it). Turning them into the selector's input vector
(entropies, KL, latencies) is `decoding.features`' job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from .actions import Action
from .features import RootFeatures  # re-exported: the raw features live with the feature schema


@dataclass(frozen=True)
class Choice:
    """An action and, optionally, the verification method of this step (None: the decoder's method) and a
    ``proposal``: the tokens of a chain ``(1, n, 0)`` proposed without the draft (`decoding.lookup`), which the
    decoder verifies with one-hot q rows instead of drafting."""

    action: Action
    method: str | None = None
    proposal: tuple[int, ...] | None = None


@dataclass(frozen=True)
class StepTiming:
    """What one finished step cost, as the decoder measured it (the ``observe_step`` hook's argument)."""

    seconds: float  # the whole step: choosing, drafting, the target pass, verification, pruning
    draft_seconds: float  # the draft's forwards (its root step and the tree); 0 for a plain step
    target_seconds: float  # the target's tree pass, with the transform of its rows
    draft_catch_up: int = 1  # tokens the draft processed at the root: 1-2 in steady state, the prompt at first
    lookup: bool = False  # the step verified a chain copied from the context (`decoding.lookup`): no draft forward

    @property
    def rest_seconds(self) -> float:
        """Everything but the forwards: features, the selector, verification, pruning."""
        return self.seconds - self.draft_seconds - self.target_seconds


@runtime_checkable
class Selector(Protocol):
    """Chooses an action at each root (see module docstring)."""

    def select(self, features: RootFeatures) -> Action | Choice: ...


class StaticPolicy:
    """The same action at every step, as a selector (it ignores its features and costs nothing)."""

    needs_hidden_states = False
    needs_draft = False

    def __init__(self, action: Action) -> None:
        self.action = action

    def select(self, features: RootFeatures) -> Action:
        return self.action

    def __repr__(self) -> str:
        return f"StaticPolicy({self.action})"


def as_policy(policy: Action | Selector) -> Selector:
    """``policy`` as a selector: an `Action` becomes a `StaticPolicy`; anything else needs ``select``."""
    if isinstance(policy, Action):
        return StaticPolicy(policy)
    if callable(getattr(policy, "select", None)):
        return policy
    raise TypeError(f"policy must be an Action or a selector with select(features) -> Action, "
                    f"got {type(policy).__name__}")


def static_action(policy: Selector) -> Action | None:
    """The fixed action of a static policy, else None."""
    return policy.action if isinstance(policy, StaticPolicy) else None


def needs_hidden_states(policy: Selector) -> bool:
    return bool(getattr(policy, "needs_hidden_states", False))


def needs_draft(policy: Selector) -> bool:
    return bool(getattr(policy, "needs_draft", True))


class AdaptiveChain:
    """The acceptance-tracking chain length of SGLang / vLLM-style serving, as a selector: a moving average
    of recent accepted lengths picks the next chain's length ``L1`` (``K = 1, L2 = 0``).

    It reads no features (``needs_draft`` False: the draft does no extra work) and infers each step's
    accepted length from the context length it is called with: a step that drafted L tokens and accepted
    a of them advances the context by ``a + 1``. A jump it cannot explain (a new prompt) restarts it at
    ``initial``. Rule: ``avg <- decay * avg + (1 - decay) * a``, next length = ``clip(floor(avg + 1/2) + 1,
    1, max_length)``, so a chain that is fully accepted grows by one and a rejected one shrinks."""

    needs_hidden_states = False
    needs_draft = False

    def __init__(self, max_length: int, initial: int = 2, decay: float = 0.5) -> None:
        if max_length < 1 or not 1 <= initial <= max_length or not 0 <= decay < 1:
            raise ValueError(f"AdaptiveChain needs 1 <= initial ({initial}) <= max_length ({max_length}) and "
                             f"0 <= decay ({decay}) < 1")
        self.max_length, self.initial, self.decay = int(max_length), int(initial), float(decay)
        self.reset()

    def reset(self) -> None:
        self.avg = float(self.initial - 1)
        self.length = self.initial
        self.last_context: int | None = None

    def select(self, features: RootFeatures) -> Action:
        ctx = int(features.context_length)
        if self.last_context is not None and 1 <= ctx - self.last_context <= self.length + 1:
            accepted = ctx - self.last_context - 1
            self.avg = self.decay * self.avg + (1 - self.decay) * accepted
            self.length = int(min(self.max_length, max(1, np.floor(self.avg + 0.5) + 1)))
        elif self.last_context is not None:
            self.reset()
        self.last_context = ctx
        return Action(1, self.length, 0)

    def __repr__(self) -> str:
        return f"AdaptiveChain(max_length={self.max_length}, initial={self.initial}, decay={self.decay})"


class Cascade:
    """The two-stage decision as a selector: ``stage1`` (target-side features only, ``needs_draft`` False) decides
    at the root; when its action drafts a tree, the decoder runs the draft's root step and asks ``stage2``
    (which may read ``q_root`` / ``q_prev`` / ``h_q_*``) through ``refine`` for the step's action and method.

    Declining (stage 1's empty tree) is exactly one plain target step: no draft work. Lossless: stage 2 reads
    only the root row, drafted before the tree and independent of the tree's tokens, so the shape is fixed
    before its tree is drawn (the decoder's ``refine`` hook, `decoding.engine.generate`)."""

    needs_draft = False

    def __init__(self, stage1: Selector, stage2: Selector) -> None:
        if needs_draft(stage1):
            raise ValueError(f"Cascade: stage 1 ({type(stage1).__name__}) must read target-side features only "
                             "(needs_draft False), so that declining costs no draft work")
        self.stage1, self.stage2 = as_policy(stage1), as_policy(stage2)
        self.needs_hidden_states = needs_hidden_states(self.stage1) or needs_hidden_states(self.stage2)

    def select(self, features: RootFeatures) -> Action | Choice:
        return self.stage1.select(features)

    def refine(self, features: RootFeatures) -> Action | Choice:
        """Stage 2's choice, with the draft's root step in ``features`` (called only when stage 1 speculates)."""
        return self.stage2.select(features)

    def observe_step(self, action: Action, context_length: int, timing: StepTiming) -> None:
        """The decoder's step-time hook, passed to each stage that has one (stage 1's decision is the one that
        weighs a step's cost against a plain step's)."""
        for stage in (self.stage1, self.stage2):
            observe = getattr(stage, "observe_step", None)
            if callable(observe):
                observe(action, context_length, timing)

    def __repr__(self) -> str:
        return f"Cascade({self.stage1!r}, {self.stage2!r})"
