"""Labels of context lookup chains at the roots of one trajectory (`decoding.lookup_gate`; beyond the paper).

At each root r of a trajectory (root token ``seq[r]``, context ``seq[:r]``), the proposal after the longest earlier
repeat of ``seq[:r + 1]`` (`decoding.lookup_gate.longest_repeat`, at most ``length`` tokens) is scored by the target
over the root and the proposed chain, after one prefill of the trajectory (all roots' chains share a forward, each
masked to its own context: `lookup_labels`): p_i(x_i), the target's
probability of each proposed token given the root and the tokens before it, under the trajectory's own sampling
setting. `decoding.lookup_gate.chain_block_efficiency` turns these into the exact Ê of every chain length: no
sampling, no draft model, so there is no label noise to average away.

A root without a repeat gets run 0 and no pass. The target's row that produced the root (p_prev, the one a decoder
holds at that root) gives the entropy feature.

`lookup_step_ratios` prices the chains: the decoder's own steps verifying n proposed tokens, timed by the decoder
(`decoding.policy.StepTiming`) against its plain steps on the same context, on this machine. (The latency profile's
target passes leave out what a lookup step adds per token, e.g. the transform of every row.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from decoding.engine.cache import KVState
from decoding.engine.torch_sampling import prob_rows
from decoding.engine.tree_pass import causal_allowed, forward_nodes
from decoding.features import entropy
from decoding.lookup_gate import MAX_RUN, longest_repeat
from decoding.sampling import Sampling


@dataclass
class LookupRows:
    """One trajectory's lookup labels (R roots, N = the longest proposal)."""

    position: list[int] = field(default_factory=list)
    run: list[int] = field(default_factory=list)  # 0: the root never occurred before (no proposal)
    proposed: list[int] = field(default_factory=list)  # tokens proposed (0..N)
    entropy_p_prev: list[float] = field(default_factory=list)  # H(p_prev), nats
    accept: list[np.ndarray] = field(default_factory=list)  # [N] p_i(x_i), NaN past the proposal

    def __len__(self) -> int:
        return len(self.position)


CHUNK_NODES = 512  # proposal nodes scored per target forward (bounds the mask and the logits)


@torch.inference_mode()
def lookup_labels(target: torch.nn.Module, seq: list[int], positions: list[int], sampling: Sampling,
                  vocab_size: int, length: int, cap: int = MAX_RUN) -> LookupRows:
    """The lookup labels of the roots at ``positions`` of ``seq`` (prompt + continuation; module docstring).

    After one prefill of ``seq`` up to the last root, the chains of all roots (root + proposal, each at positions
    r, r + 1, ...) go through the target together, at most `CHUNK_NODES` nodes per forward: each chain attends to
    the cached context before its own root and causally to itself, nothing else (the same rows as one tree pass
    per root on a fork of the cache; tests/test_lookup_gate.py checks them against plain causal forwards)."""
    out = LookupRows()
    if not positions:
        return out
    if min(positions) < 1 or max(positions) >= len(seq):
        raise ValueError(f"root positions must lie in [1, {len(seq) - 1}], got {positions}")
    last = max(positions)
    kv = KVState(target)
    logits, _ = forward_nodes(kv, seq[:last], list(range(last)), causal_allowed(0, last),
                              rows=[r - 1 for r in positions])  # [R, V']: the head skips the other positions
    h_prev = entropy(prob_rows(logits, sampling, vocab_size))  # [R]
    del logits
    found = [longest_repeat(seq[: r + 1], length, cap) for r in positions]
    accept = np.full((len(positions), length), np.nan)
    chains = [(i, r, [int(seq[r]), *f.tokens]) for i, (r, f) in enumerate(zip(positions, found, strict=True))
              if f is not None]  # a repeat is always followed by at least one token
    while chains:
        take, nodes = [], 0
        while chains and (not take or nodes + len(chains[0][2]) <= CHUNK_NODES):
            take.append(chains.pop(0))
            nodes += len(take[-1][2])
        tokens, pos = [], []
        allowed = np.zeros((nodes, last + nodes), dtype=bool)
        o = 0
        for _, r, chain in take:
            b = len(chain)
            tokens += chain
            pos += list(range(r, r + b))
            allowed[o:o + b, :r] = True  # the context before this root
            allowed[o:o + b, last + o:last + o + b] = np.tril(np.ones((b, b), dtype=bool))
            o += b
        rows_logits, _ = forward_nodes(kv.fork(last), tokens, pos, allowed)
        p = prob_rows(rows_logits, sampling, vocab_size)  # row of node j: p(.| context, root, x_1..x_j)
        o = 0
        for i, _, chain in take:
            n = len(chain) - 1
            accept[i, :n] = p[o + np.arange(n), np.asarray(chain[1:])]
            o += n + 1
    for i, r in enumerate(positions):
        out.position.append(int(r))
        out.run.append(0 if found[i] is None else found[i].run)
        out.proposed.append(0 if found[i] is None else len(found[i].tokens))
        out.entropy_p_prev.append(float(h_prev[i]))
        out.accept.append(accept[i])
    return out


class _ForcedChain:
    """Verifies the last ``n`` context tokens as a proposal at every step (a plain step for n = 0) and records what
    each step cost: only the cost matters here, so the proposal need not be any good."""

    uses_draft_model = False

    def __init__(self, n: int) -> None:
        self.n, self.seconds = n, []

    def select(self, features):
        from decoding.actions import AR_ACTION, Action
        from decoding.policy import Choice

        if self.n == 0:
            return Choice(AR_ACTION)
        return Choice(Action(1, self.n, 0), "naive", tuple(int(t) for t in features.context[-self.n:]))

    def observe_step(self, action, context_length, timing) -> None:
        self.seconds.append(timing.seconds)


def lookup_step_ratios(target: torch.nn.Module, vocab_size: int, prompt: list[int], max_length: int,
                       samplings: list[Sampling], rounds: int = 4, steps: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """``(line, measured)``, each ``[max_length]``: the median decoder step verifying n = 1..max_length proposed
    tokens over the median plain step, decoding ``prompt`` ``rounds`` times per sampling setting, the lengths
    interleaved in a rotated order (``measured``), and the least-squares line a + b n through them (``line``: what a
    step costs grows with the tokens it verifies; single medians of a 2-core machine jump by 10% either way)."""
    from decoding.engine import SpeculativeDecoder

    decoder = SpeculativeDecoder(target, None, vocab_size)
    policies = [_ForcedChain(n) for n in range(max_length + 1)]
    for sampling in samplings:
        for r in range(rounds + 1):  # round 0 warms up (allocator, first calls): not kept
            order = policies[r % len(policies):] + policies[: r % len(policies)]
            for policy in order:
                before = len(policy.seconds)
                decoder.generate(list(prompt), steps, "naive", policy, sampling, seed=r)
                if r == 0:
                    del policy.seconds[before:]
    median = np.array([float(np.median(p.seconds)) for p in policies])
    measured = median[1:] / median[0]
    n = np.arange(1, max_length + 1, dtype=np.float64)
    if max_length < 2:
        return measured.copy(), measured
    b, a = np.polyfit(n, measured, 1)
    return np.maximum(a + b * n, 1e-3), measured
