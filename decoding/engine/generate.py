"""The decode loop: speculative decoding with delayed draft trees, and plain autoregressive sampling.

One *step* starts at a *root* (the last emitted token, not yet processed by the target):
1. the draft processes its pending tokens (ending with the root) -> q(.|root);
2. the policy picks the action (a static `Action`, or a selector's ``select(features)``);
3. the draft drafts the action's tree (`drafting.draft_tree`);
4. one target pass over root + tree on the target's KV cache (`tree_pass.target_tree_pass`);
5. the verification method accepts a path and emits one token;
6. both caches keep only the accepted path (`cache.KVState.keep`); the context is never re-encoded.
Autoregressive sampling is the same loop with the empty tree (action ``1,0,0``): no draft, one target
pass on the root, one token drawn from p.

All randomness (draft draws and verification) comes from one ``numpy.random.Generator(seed)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from ..actions import Action
from ..sampling import Sampling, draw, to_numpy_rows, transform_logits
from ..tree import build_tree
from ..verifiers import get_method
from .cache import KVState
from .drafting import draft_tree
from .policy import RootFeatures, Selector, as_policy
from .stats import DecodeStats, Timer
from .tree_pass import causal_allowed, forward_nodes, target_tree_pass

AUTOREGRESSIVE = "autoregressive"
AR_ACTION = Action(1, 0, 0)
DEFAULT_ACTION = Action(2, 2, 3)
DEFAULT_SAMPLING = Sampling()


@dataclass
class DecodeResult:
    tokens: list[int]  # new tokens (EOS included when it ended the run)
    stats: DecodeStats


class SpeculativeDecoder:
    """A target/draft pair ready to decode (models in eval mode, on one device, same vocabulary).

    ``vocab_size``: the common vocabulary both models' logits are cut to. ``draft`` may be None for
    autoregressive decoding only. ``eos_token_ids``: decoding stops after emitting any of them."""

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module | None, vocab_size: int,
                 eos_token_ids: Iterable[int] = ()) -> None:
        self.target = target
        self.draft = draft
        self.vocab_size = int(vocab_size)
        self.eos = {int(t) for t in eos_token_ids}

    @torch.inference_mode()
    def generate(self, prompt: list[int], max_new_tokens: int, method: str = "traversal",
                 policy: Action | Selector = DEFAULT_ACTION, sampling: Sampling = DEFAULT_SAMPLING,
                 seed: int = 0) -> DecodeResult:
        """Decode up to ``max_new_tokens`` tokens after ``prompt`` (token ids, at least one).

        ``method``: a name of ``decoding.verifiers.METHODS`` or ``"autoregressive"`` (policy ignored)."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("generate: the prompt must contain at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
        if method == AUTOREGRESSIVE:
            policy, verifier = AR_ACTION, None
        else:
            policy, verifier = as_policy(policy), get_method(method)
        static = isinstance(policy, Action)
        if static and not policy.tree_size == 0:
            _check_supported(verifier, policy)
        use_draft = not (static and policy.tree_size == 0)
        if use_draft and self.draft is None:
            raise ValueError(f"generate: method {method!r} with policy {policy} needs a draft model")
        hidden = (not static) and bool(getattr(policy, "needs_hidden_states", False))
        rng = np.random.default_rng(seed)
        stats = DecodeStats(method=method if verifier is None else verifier.name)
        clock = Timer(next(self.target.parameters()).device)
        t_start = clock.t

        def rows(logits: torch.Tensor) -> np.ndarray:
            return to_numpy_rows(transform_logits(logits, sampling, self.vocab_size))

        # prefill both caches with the prompt up to (not including) the root
        kv_t = KVState(self.target)
        p_prev = h_p_prev = q_prev = h_q_prev = None
        if len(prompt) > 1:
            logits, h = forward_nodes(kv_t, prompt[:-1], list(range(len(prompt) - 1)),
                                      causal_allowed(0, len(prompt) - 1), hidden, last=1)
            if not static:
                p_prev, h_p_prev = rows(logits[-1]), (h[-1] if hidden else None)
        stats.time_target += clock.lap()
        kv_d = KVState(self.draft) if use_draft else None
        pending = list(prompt) if use_draft else []  # draft tokens not yet in the draft cache
        out: list[int] = []
        seq_len = len(prompt)  # tokens so far incl. the root
        while True:
            root = out[-1] if out else prompt[-1]
            # 1. draft sees the root
            q_root = h_q_root = None
            if use_draft:
                logits, h = forward_nodes(kv_d, pending, list(range(len(kv_d), len(kv_d) + len(pending))),
                                          causal_allowed(len(kv_d), len(pending)), hidden, last=2)
                q_root = rows(logits[-1])
                if len(pending) >= 2 and not static:
                    q_prev, h_q_prev = rows(logits[-2]), (h[-2] if hidden else None)
                h_q_root = h[-1] if hidden else None
                root_slot = len(kv_d) - 1
                stats.time_draft += clock.lap()
            # 2. the action
            if static:
                action = policy
            else:
                action = policy.select(RootFeatures(seq_len - 1, sampling, q_root, q_prev, p_prev,
                                                    h_q_root, h_q_prev, h_p_prev))
                if not isinstance(action, Action):
                    raise TypeError(f"selector {type(policy).__name__}.select returned {action!r}, not an Action")
                if action.tree_size:
                    _check_supported(verifier, action)
                stats.time_selector += clock.lap()
            # 3. drafting
            node_slots = {0: 0}
            if action.tree_size:
                drafted = draft_tree(kv_d, root_slot, q_root, action, sampling, self.vocab_size, rng)
                tree, node_slots = drafted.tree, drafted.node_slots
                stats.time_draft += clock.lap()
            else:
                tree = build_tree(AR_ACTION, np.array([-1]), np.zeros((1, 1)))
            # 4. target pass
            ctx_t = len(kv_t)
            logits, h_t = target_tree_pass(kv_t, root, tree, hidden)
            p_rows = rows(logits)  # [n, V]
            stats.time_target += clock.lap()
            # 5. verification
            if action.tree_size:
                accepted, emitted = verifier.verify(tree, p_rows, rng)
                accepted = [int(i) for i in accepted]
            else:
                accepted, emitted = [], int(draw(p_rows[0], rng)[0, 0])
            stats.time_verify += clock.lap()
            # 6. keep the accepted path in both caches
            path = [0] + accepted
            kv_t.keep(ctx_t, [ctx_t + i for i in path])
            new = [int(tree.tokens[i]) for i in accepted] + [int(emitted)]
            last = path[-1]
            if use_draft:
                if action.tree_size:
                    kv_d.keep(root_slot, [node_slots[i] for i in path if i in node_slots])
                    pending = [int(tree.tokens[i]) for i in path if i not in node_slots] + [int(emitted)]
                    if not static and last in node_slots:
                        q_prev = tree.q_rows[last]
                        h_q_prev = None  # drafting does not keep hidden states; the selector sees None
                else:
                    pending = [int(emitted)]
                    q_prev, h_q_prev = q_root, h_q_root
            if not static:
                p_prev, h_p_prev = p_rows[last], (h_t[last] if hidden else None)
            stats.record_step(int(tree.depths.max()), len(accepted), str(action))
            # EOS and length
            done = False
            for tok in new:
                out.append(tok)
                if tok in self.eos or len(out) >= max_new_tokens:
                    done = True
                    break
            seq_len = len(prompt) + len(out)
            clock.lap()
            if done:
                break
        stats.new_tokens = len(out)
        stats.time_total = clock.t - t_start
        return DecodeResult(out, stats)


def _check_supported(verifier, action: Action) -> None:
    parents_tree = build_tree(action, np.full(action.tree_size + 1, -1), np.zeros((action.tree_size + 1, 1)))
    if not verifier.supports(parents_tree):
        raise ValueError(f"method {verifier.name!r} does not support the tree of action {action} "
                         "(chain-only method on a branching tree); use a tree method or K = 1")


def generate(target: torch.nn.Module, draft: torch.nn.Module | None, prompt: list[int], max_new_tokens: int,
             method: str = "traversal", policy: Action | Selector = DEFAULT_ACTION,
             sampling: Sampling = DEFAULT_SAMPLING, seed: int = 0, vocab_size: int | None = None,
             eos_token_ids: Iterable[int] = ()) -> DecodeResult:
    """Functional form of `SpeculativeDecoder.generate` (vocab_size defaults to the target's head)."""
    if vocab_size is None:
        vocab_size = target.get_output_embeddings().weight.shape[0]
    return SpeculativeDecoder(target, draft, vocab_size, eos_token_ids).generate(
        prompt, max_new_tokens, method, policy, sampling, seed)
