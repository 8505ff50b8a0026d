"""Actions of delayed tree expansion (ALGORITHMS.md section 2): the one place that defines them.

An *action* ``(K, L1, L2)`` drafts a *trunk* of L1 tokens (each trunk node has exactly one child),
then at the *branch node* (root + trunk, depth L1) K i.i.d. *rollouts* of L2 tokens each.
Tree size (draft nodes, root excluded): ``L1 + K * L2``.

The *action space* is the grid K x L1 x L2 (paper default: K in 1..4, L1 in 0..8, L2 in 0..8, 324
actions). Actions with ``L2 = 0`` draw no rollouts, so K does not change the tree: they are kept
in the list (the selector's output layout stays a full, stable grid of 4 * 9 * 9 = 324 outputs) but
``ActionSpace.canonical`` maps them to ``K = min(K range)`` so their labels are computed once and
shared. (K = 1 actions with equal L1 + L2 are also the same chain in distribution; they are NOT
merged: each keeps its own draws in the union tree, and the latency model prices them the same.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import UserInputError


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserInputError(f"Action.{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise UserInputError(f"Action.{name} must be >= {minimum}, got {value}")


@dataclass(frozen=True, order=True)
class Action:
    """Shape of one delayed draft tree: K rollouts of L2 tokens after a trunk of L1 tokens."""

    K: int  # number of i.i.d. rollouts at the branch node (>= 1)
    L1: int  # trunk length = depth of the branch node (>= 0)
    L2: int  # rollout length (>= 0)

    def __post_init__(self) -> None:
        _check_int("K", self.K, 1)
        _check_int("L1", self.L1, 0)
        _check_int("L2", self.L2, 0)

    @property
    def tree_size(self) -> int:
        """Number of draft nodes (root excluded)."""
        return self.L1 + self.K * self.L2

    @property
    def is_chain(self) -> bool:
        """True when every node has at most one child (K = 1 or no rollouts)."""
        return self.K == 1 or self.L2 == 0

    def __str__(self) -> str:
        return f"{self.K},{self.L1},{self.L2}"


# Autoregressive decoding as a policy: no tree, one target step (E = 1); the one spelling of its name and action.
AUTOREGRESSIVE = "autoregressive"
AR_ACTION = Action(1, 0, 0)


def parse_action(text: str) -> Action:
    """Parse ``"K,L1,L2"`` (e.g. ``"4,2,3"``; spaces allowed) into an Action."""
    parts = [s.strip() for s in str(text).split(",")]
    if len(parts) != 3:
        raise UserInputError(f"action {text!r}: expected 'K,L1,L2' (three comma-separated ints)")
    try:
        k, l1, l2 = (int(s) for s in parts)
    except ValueError:
        raise UserInputError(f"action {text!r}: expected 'K,L1,L2' with integer fields") from None
    return Action(k, l1, l2)


def _as_range(name: str, values: Sequence[int] | range) -> tuple[int, ...]:
    vals = tuple(values)
    if not vals:
        raise UserInputError(f"ActionSpace.{name}: empty range")
    if len(set(vals)) != len(vals) or list(vals) != sorted(vals):
        raise UserInputError(f"ActionSpace.{name}: values must be strictly increasing, got {vals}")
    return vals


class ActionSpace:
    """The grid of candidate actions, in a stable order: K outermost, then L1, then L2.

    ``actions[i]`` is output i of the selector; ``index(action)`` inverts it.
    """

    def __init__(self, K: Sequence[int] | range = range(1, 5), L1: Sequence[int] | range = range(0, 9),
                 L2: Sequence[int] | range = range(0, 9)) -> None:
        self.K = _as_range("K", K)
        self.L1 = _as_range("L1", L1)
        self.L2 = _as_range("L2", L2)
        self.actions: tuple[Action, ...] = tuple(
            Action(k, l1, l2) for k in self.K for l1 in self.L1 for l2 in self.L2)  # validates
        self._index = {a: i for i, a in enumerate(self.actions)}

    @classmethod
    def from_config(cls, cfg: dict) -> ActionSpace:
        """Build from ``{"K": [min, max], "L1": [min, max], "L2": [min, max]}`` (inclusive bounds)."""
        try:
            return cls(**{f: range(int(cfg[f][0]), int(cfg[f][1]) + 1) for f in ("K", "L1", "L2")})
        except (KeyError, TypeError, IndexError) as e:
            raise UserInputError(f"action space config {cfg!r}: expected keys K, L1, L2 with [min, max]") from e

    def __len__(self) -> int:
        return len(self.actions)

    def __iter__(self) -> Iterator[Action]:
        return iter(self.actions)

    def __getitem__(self, i: int) -> Action:
        return self.actions[i]

    def __contains__(self, action: object) -> bool:
        return action in self._index

    def __repr__(self) -> str:
        def r(v: tuple[int, ...]) -> str:
            return f"{v[0]}..{v[-1]}" if v == tuple(range(v[0], v[-1] + 1)) else str(list(v))
        return f"ActionSpace(K={r(self.K)}, L1={r(self.L1)}, L2={r(self.L2)}; {len(self)} actions)"

    def index(self, action: Action) -> int:
        """Position of ``action`` in ``actions`` (ValueError if it is outside the space)."""
        try:
            return self._index[action]
        except KeyError:
            raise UserInputError(f"action {action} is not in {self!r}") from None

    def canonical(self, action: Action) -> Action:
        """The representative whose label is computed: ``L2 = 0`` actions map to ``K = min(K)``."""
        self.index(action)
        return Action(self.K[0], action.L1, 0) if action.L2 == 0 else action

    def canonical_index(self) -> list[int]:
        """For each action, the index of its canonical representative."""
        return [self._index[self.canonical(a)] for a in self.actions]

    def canonical_array(self) -> np.ndarray:
        """``canonical_index()`` as a cached int array ``[A]``."""
        if not hasattr(self, "_canonical"):
            self._canonical = np.array(self.canonical_index(), dtype=np.int64)
        return self._canonical

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Cached ``(K, L1, L2, position of L1 in the L1 range)``, each ``[A]`` int64, in action order."""
        if not hasattr(self, "_arrays"):
            ks, l1s, l2s = (np.array([getattr(a, f) for a in self.actions], dtype=np.int64) for f in ("K", "L1", "L2"))
            self._arrays = (ks, l1s, l2s, np.array([self.L1.index(a.L1) for a in self.actions], dtype=np.int64))
        return self._arrays

    @property
    def max_action(self) -> Action:
        """``(max K, max L1, max L2)``: the envelope the union tree of labels is drafted for."""
        return Action(self.K[-1], self.L1[-1], self.L2[-1])
