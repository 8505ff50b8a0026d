"""The decode loop: speculative decoding with delayed draft trees, and plain autoregressive sampling.

`SpeculativeDecoder.generate` is a loop over `SpeculativeDecoder.step`; collection and evaluation call
the same step. One *step* starts at a *root* (the last emitted token, not yet processed by the target):
1. choose: the policy (`decoding.policy.Policy`) picks the step. A static action costs nothing; any other policy
   gets `RootFeatures` (after the draft's root step when it ``needs_draft``) and returns an action or a `Choice`;
2. draft: the draft catches up on its pending tokens (ending with the root) -> q(.|root), then drafts the
   action's tree (`drafting.draft_tree`), or a chain with a stop rule (``Choice.stop_after``:
   `drafting.draft_stop_chain`); a tree the policy built itself (``Choice.proposal``, e.g. a lookup chain with
   one-hot q rows) is verified as it is, with no draft forward; an empty tree skips the draft entirely;
3. target pass: one pass over root + tree on the target's KV cache (`tree_pass.target_tree_pass`);
4. verify: the verification method accepts a path and emits one token;
5. prune: both caches keep only the accepted path (`cache.KVState.keep`); the context is never
   re-encoded. The draft's rows and hidden states at the new root's predecessor are kept for the
   next step's features.
6. observe: the policy's ``observe`` gets the `StepResult` with what the step cost (`StepTiming`).
Autoregressive sampling is the same loop with the empty tree (action ``1,0,0``): no draft, one target
pass on the root, one token drawn from p.

All randomness (draft draws and verification) comes from one ``numpy.random.Generator(seed)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from decoding.actions import AR_ACTION, AUTOREGRESSIVE, Action
from decoding.errors import UserInputError
from decoding.policy import Choice, Policy, RootFeatures, StepResult, StepTiming, as_policy
from decoding.pricing import step_class
from decoding.sampling import Sampling, draw
from decoding.tree import build_tree
from verifiers import get_method
from verifiers.base import VerificationMethod

from .cache import KVState
from .drafting import DraftRoot, DraftRule, draft_stop_chain, draft_tree
from .stats import DecodeStats, Timer
from .torch_sampling import prob_rows
from .tree_pass import causal_allowed, forward_nodes, hidden_numpy, input_embeddings, target_tree_pass

DEFAULT_ACTION = Action(2, 2, 3)
DEFAULT_SAMPLING = Sampling()


@dataclass
class DecodeState:
    """Everything that carries over from one step to the next."""

    prompt: list[int]
    kv_t: KVState  # target cache: the accepted sequence up to (not including) the root
    kv_d: KVState | None  # draft cache: the accepted sequence minus ``pending``
    pending: list[int]  # accepted tokens the draft has not processed yet (ending with the root)
    out: list[int] = field(default_factory=list)  # emitted tokens (the last one is the root)
    p_prev: np.ndarray | None = None  # [V] target row at the token before the root
    h_p_prev: np.ndarray | None = None  # [H_p]
    q_prev: np.ndarray | None = None  # [V] draft row at the token before the root, when pending == [root]
    h_q_prev: np.ndarray | None = None  # [H_q]
    f_prev: torch.Tensor | None = None  # [2, H] the target's features two tokens and one token before the root
    f_root: torch.Tensor | None = None  # [H] a feature draft's own feature at the root, after its root step
    drafts: bool = False  # the draft model takes part in this decode

    @property
    def root(self) -> int:
        return self.out[-1] if self.out else self.prompt[-1]

    @property
    def context_length(self) -> int:
        """Tokens before the root."""
        return len(self.prompt) + len(self.out) - 1


@dataclass
class DecodeRun:
    """What every step of one decode shares: the policy, the verification method it starts with (None:
    autoregressive), the sampling transform, the random generator, the statistics, the clock, and whether the
    policy's features need hidden states."""

    policy: Policy
    verifier: VerificationMethod | None
    sampling: Sampling
    rng: np.random.Generator
    stats: DecodeStats
    clock: Timer
    hidden: bool


@dataclass
class _Chosen:
    """Step 1's outcome: the checked `Choice`, its verifier, the features the policy saw (None for a static action),
    ``(q_root, h_q_root)`` when the draft's root step ran for them, and that step's prompt prefill seconds."""

    choice: Choice
    verifier: VerificationMethod | None
    features: RootFeatures | None
    root_step: tuple = (None, None)
    prefill: float = 0.0
    seconds: float = 0.0  # the features and ``select`` (the draft's root step not included)


@dataclass
class _Verified:
    """Steps 2-4's outcome that pruning needs: the verified tree, its drafting (None without drafted nodes), the
    accepted nodes, the emitted token and ``(q_root, h_q_root)`` when the draft saw the root this step."""

    tree: object  # decoding.tree.DraftTree
    drafted: object  # drafting.DraftedTree | None
    accepted: list[int]
    emitted: int
    root_step: tuple


@dataclass
class DecodeResult:
    tokens: list[int]  # new tokens (EOS included when it ended the run)
    stats: DecodeStats
    steps: list[StepResult] = field(default_factory=list)  # every step, its features dropped (they hold [V] rows)


class SpeculativeDecoder:
    """A target/draft pair ready to decode (models in eval mode, on one device, same vocabulary).

    ``vocab_size``: the common vocabulary both models' logits are cut to (default: the target's head). ``draft`` may
    be None for autoregressive decoding only. ``eos_token_ids``: decoding stops after emitting any of them."""

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module | None, vocab_size: int | None = None,
                 eos_token_ids: Iterable[int] = ()) -> None:
        self.target = target
        self.draft = draft
        if vocab_size is None:
            vocab_size = target.get_output_embeddings().weight.shape[0]
        self.vocab_size = int(vocab_size)
        self.eos = {int(t) for t in eos_token_ids}
        # a feature draft (`models.eagle_draft`) keeps no cache: it reads the target's feature before the root
        self.feature_draft = bool(getattr(draft, "reads_target_hidden", False))

    def _rows(self, logits: torch.Tensor, sampling: Sampling) -> np.ndarray:
        return prob_rows(logits, sampling, self.vocab_size)

    def start(self, prompt: list[int], sampling: Sampling, hidden: bool = False, use_draft: bool = True
              ) -> DecodeState:
        """Prefill the target with the prompt up to (not including) the root; the draft starts lazily."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise UserInputError("generate: the prompt must contain at least one token")
        drafts = use_draft and self.draft is not None
        kv_d = KVState(self.draft) if drafts and not self.feature_draft else None
        state = DecodeState(prompt, KVState(self.target), kv_d, list(prompt) if kv_d is not None else [],
                            drafts=drafts)
        n = len(prompt) - 1
        features = hidden or (drafts and self.feature_draft)
        if drafts and self.feature_draft:  # zero features before the first token
            state.f_prev = torch.zeros(2, self.target.config.hidden_size, device=state.kv_t.device)
        if n:
            logits, h = forward_nodes(state.kv_t, prompt[:-1], list(range(n)), causal_allowed(0, n), features, keep=2)
            state.p_prev, state.h_p_prev = self._rows(logits[-1], sampling), hidden_numpy(h[-1] if hidden else None)
            if drafts and self.feature_draft:
                state.f_prev[2 - h.shape[0]:] = h
        return state

    def draft_root(self, state: DecodeState, sampling: Sampling, hidden: bool, prev: bool = True
                   ) -> tuple[np.ndarray, np.ndarray | None]:
        """The draft processes its pending tokens (ending with the root): returns ``(q_root, h_q_root)`` and
        refreshes ``state.q_prev`` / ``h_q_prev`` when the token before the root was pending too. ``prev=False``:
        no features will read them this step, so that row stays on the device (they are cleared instead; the step's
        pruning or the next root step sets them again)."""
        kv, pending = state.kv_d, state.pending
        if not state.drafts:
            raise UserInputError("this step drafts a tree but the decoder has no draft model")
        if kv is None:  # a feature draft: its step on the target's feature before the root (and, for the features,
            # on the one before that: its row at the token before the root, as collection computes it)
            context = state.prompt + state.out
            if prev and len(context) >= 2:
                logits, f = self.draft.step(state.f_prev, torch.tensor(context[-2:]))
                state.q_prev, state.h_q_prev = self._rows(logits[0], sampling), hidden_numpy(f[0] if hidden else None)
            else:
                logits, f = self.draft.step(state.f_prev[1:], torch.tensor([state.root]))
                state.q_prev = state.h_q_prev = None
            state.f_root = f[-1]
            return self._rows(logits[-1], sampling), hidden_numpy(f[-1] if hidden else None)
        start = len(kv)
        logits, h = forward_nodes(kv, pending, list(range(start, start + len(pending))),
                                  causal_allowed(start, len(pending)), hidden, keep=2)
        if len(pending) >= 2 and prev:
            state.q_prev, state.h_q_prev = self._rows(logits[-2], sampling), hidden_numpy(h[-2] if hidden else None)
        elif len(pending) >= 2:
            state.q_prev = state.h_q_prev = None
        state.pending = []
        return self._rows(logits[-1], sampling), hidden_numpy(h[-1] if hidden else None)

    def _draft_root_timed(self, state: DecodeState, run: DecodeRun, prev: bool = True
                          ) -> tuple[np.ndarray, np.ndarray | None, float]:
        """`draft_root`, its seconds added to the draft's; the third value is those seconds when this was the draft's
        first forward (its prefill over the prompt), else 0."""
        first = state.kv_d is not None and len(state.kv_d) == 0
        q_root, h_q_root = self.draft_root(state, run.sampling, run.hidden, prev)
        seconds = run.clock.lap()
        run.stats.time_draft += seconds
        if first:
            run.stats.time_prefill += seconds
        return q_root, h_q_root, seconds if first else 0.0

    def _features(self, state: DecodeState, sampling: Sampling, q_root, h_q_root, hidden: bool) -> RootFeatures:
        """The root's features (the draft's rows only when it saw the root this step)."""
        drafted_now = q_root is not None
        e_root = input_embeddings(self.target, [state.root])[0] if hidden else None
        return RootFeatures(state.context_length, sampling, state.p_prev, state.q_prev if drafted_now else None,
                            q_root, state.h_p_prev, state.h_q_prev if drafted_now else None, h_q_root, e_root, {},
                            state.prompt + state.out)

    @torch.inference_mode()
    def step(self, state: DecodeState, run: DecodeRun) -> StepResult:
        """One speculation step from ``state``'s root (module docstring); appends to ``state.out`` and tells the
        policy's ``observe`` what the step did and cost."""
        stats, clock, sampling, rng, hidden = run.stats, run.clock, run.sampling, run.rng, run.hidden
        start, context_length = clock.t, state.context_length
        parts_before = (stats.time_draft, stats.time_target)
        # 1. choose (after the draft's root step when the policy's features need it)
        chosen = self._choose(state, run)
        choice, verifier, features, root_step, prefill = (chosen.choice, chosen.verifier, chosen.features,
                                                          chosen.root_step, chosen.prefill)
        action = choice.action
        # 2. draft (a policy's own tree is verified as it is, with no draft forward)
        drafted = None
        if choice.proposal is not None:
            check_supported(verifier, action)
            tree = choice.proposal
        elif action.tree_size:
            check_supported(verifier, action)
            if root_step[0] is None:  # no features this step: the row before the root is not needed
                *root_step, prefill = self._draft_root_timed(state, run, prev=False)
            root = DraftRoot(state.kv_d, *root_step, draft=self.draft, feature=state.f_root)
            rule = DraftRule(sampling, self.vocab_size, hidden)
            if choice.stop_after is None:
                drafted = draft_tree(root, action, rule, rng)
            else:
                drafted = draft_stop_chain(root, action.L1, choice.stop_after, rule, rng)
            tree, action = drafted.tree, drafted.tree.action  # the realized shape
            stats.time_draft += clock.lap()
        else:
            tree = build_tree(AR_ACTION, np.array([-1]), np.zeros((1, 1)))
        # 3. target pass
        ctx_t = len(state.kv_t)
        features = hidden or (state.drafts and self.feature_draft)
        logits, h_t = target_tree_pass(state.kv_t, state.root, tree, features)
        p_rows = self._rows(logits, sampling)  # [n, V]
        stats.time_target += clock.lap()
        # 4. verify
        if action.tree_size:
            accepted, emitted = verifier.verify(tree, p_rows, rng)
            accepted = [int(i) for i in accepted]
        else:
            accepted, emitted = [], int(draw(p_rows[0], rng)[0, 0])
        stats.time_verify += clock.lap()
        # 5. prune both caches to the accepted path; keep the rows before the new root
        last = _prune(state, ctx_t, _Verified(tree, drafted, accepted, int(emitted), tuple(root_step)), hidden)
        state.p_prev, state.h_p_prev = p_rows[last], hidden_numpy(h_t[last] if hidden else None)
        if state.drafts and self.feature_draft:
            path = [0] + accepted
            state.f_prev = torch.stack([h_t[path[-2]] if len(path) >= 2 else state.f_prev[1], h_t[last]])
        new = [int(tree.tokens[i]) for i in accepted] + [int(emitted)]
        proposed = choice.proposal is not None
        method = verifier.name if verifier is not None and action.tree_size else None
        stats.record_step(int(tree.depths.max()), len(accepted), step_class(action, method, proposed), method)
        state.out.extend(new)
        # 6. observe
        timing = StepTiming(clock.now() - start, stats.time_draft - parts_before[0], stats.time_target - parts_before[1],
                            prefill, chosen.seconds)
        result = StepResult(action, method, new, features, context_length, timing, proposed, features is not None)
        run.policy.observe(result)
        return result

    def _choose(self, state: DecodeState, run: DecodeRun) -> _Chosen:
        """Step 1 (`_Chosen`). A static action costs nothing; a policy gets its features after the draft's root step
        when it ``needs_draft``."""
        policy, verifier = run.policy, run.verifier
        if policy.fixed_action is not None:
            return _Chosen(Choice(policy.fixed_action), verifier, None)
        q_root = h_q_root = None
        prefill = 0.0
        if policy.needs_draft and state.drafts:
            q_root, h_q_root, prefill = self._draft_root_timed(state, run)
        features = self._features(state, run.sampling, q_root, h_q_root, run.hidden)
        choice = _as_choice(policy, policy.select(features))
        if choice.method is not None:
            verifier = get_method(choice.method)
        seconds = run.clock.lap()
        run.stats.time_selector += seconds
        return _Chosen(choice, verifier, features, (q_root, h_q_root), prefill, seconds)

    @torch.inference_mode()
    def generate(self, prompt: list[int], max_new_tokens: int, method: str = "traversal",
                 policy: Action | Policy = DEFAULT_ACTION, sampling: Sampling = DEFAULT_SAMPLING,
                 seed: int = 0) -> DecodeResult:
        """Decode up to ``max_new_tokens`` tokens after ``prompt`` (token ids, at least one).

        ``method``: a name of ``verifiers.METHODS`` or ``"autoregressive"`` (policy ignored).
        The result lists every step (`decoding.policy.StepResult`) without its features."""
        if max_new_tokens < 1:
            raise UserInputError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
        if method == AUTOREGRESSIVE:
            policy, verifier = as_policy(AR_ACTION), None
        else:
            policy, verifier = as_policy(policy), get_method(method)
        if policy.fixed_action is not None and policy.fixed_action.tree_size:
            check_supported(verifier, policy.fixed_action)
        if policy.uses_draft_model and self.draft is None:
            raise UserInputError(f"generate: method {method!r} with policy {policy} needs a draft model")
        hidden = policy.fixed_action is None and policy.needs_hidden_states
        stats = DecodeStats(method=method if verifier is None else verifier.name)
        clock = Timer(next(self.target.parameters()).device)
        run = DecodeRun(policy, verifier, sampling, np.random.default_rng(seed), stats, clock, hidden)
        t_start = clock.t
        state = self.start(prompt, sampling, hidden, policy.uses_draft_model)
        prefill = clock.lap()
        stats.time_target += prefill
        stats.time_prefill += prefill
        steps = []
        while True:
            before = len(state.out)
            steps.append(dataclasses.replace(self.step(state, run), features=None))
            cut = _stop_index(state.out, before, self.eos, max_new_tokens)
            clock.lap()
            if cut is not None:
                del state.out[cut:]
                break
        stats.new_tokens = len(state.out)
        stats.time_total = clock.t - t_start
        return DecodeResult(state.out, stats, steps)


def _as_choice(policy: Policy, choice) -> Choice:
    """A policy's answer (an `Action` or a `Choice`) as a `Choice`, checked: a proposal is a tree of the Choice's
    action and excludes a stop rule; a stop rule drafts a chain ``1,L1,0``."""
    if isinstance(choice, Action):
        return Choice(choice)
    name = type(policy).__name__
    if not isinstance(choice, Choice):
        raise TypeError(f"policy {name}.select returned {choice!r}, not an Action or a Choice")
    if choice.proposal is not None:
        if choice.stop_after is not None:
            raise ValueError(f"policy {name}: a Choice proposes a tree or drafts a chain with a stop rule, not both")
        if choice.proposal.action != choice.action:
            raise ValueError(f"policy {name}: a proposal of shape {choice.proposal.action} is not the Choice's "
                             f"action {choice.action}")
    if choice.stop_after is not None and (choice.action.K, choice.action.L2) != (1, 0):
        # the stop rule drafts up to L1 tokens; an is_chain action such as 1,2,1 (3 tokens) would lose its L2
        raise ValueError(f"policy {name}: stop_after drafts the chain 1,L1,0 (up to L1 tokens), not {choice.action}")
    return choice



def _prune(state: DecodeState, ctx_t: int, step: _Verified, hidden: bool) -> int:
    """Step 5: prune the target cache (and the draft's, when it drafted) to the accepted path, and set what the
    draft still has to catch up on (``pending``) and its last row (``q_prev``, ``h_q_prev``). Returns the last node of
    the accepted path (0 = the root)."""
    tree, drafted, accepted, emitted, root_step = step.tree, step.drafted, step.accepted, step.emitted, step.root_step
    path = [0] + accepted
    last = path[-1]
    state.kv_t.keep(ctx_t, [ctx_t + i for i in path])
    if state.kv_d is None:
        return last
    if drafted is not None:
        node_slots = drafted.node_slots
        state.kv_d.keep(node_slots[0], [node_slots[i] for i in path if i in node_slots])
        state.pending = [int(tree.tokens[i]) for i in path if i not in node_slots] + [emitted]
        if last in node_slots:
            state.q_prev = tree.q_rows[last]
            state.h_q_prev = drafted.hidden[last] if hidden else None
    else:  # no drafted node: a plain step, or a proposed chain (`policies.lookup`) the draft catches up on later
        new = [int(tree.tokens[i]) for i in accepted] + [emitted]
        if root_step[0] is not None:  # the draft saw the root this step
            state.pending = new
            if not accepted:
                state.q_prev, state.h_q_prev = root_step
        else:
            state.pending.extend(new)
    return last

def _stop_index(out: list[int], start: int, eos: set[int], max_new_tokens: int) -> int | None:
    """Length to cut ``out`` to when a token from ``start`` on is an EOS or reaches the limit, else None."""
    for i in range(start, len(out)):
        if out[i] in eos or i + 1 >= max_new_tokens:
            return i + 1
    return None


def check_supported(verifier: VerificationMethod | None, action: Action) -> None:
    """Fail with a clear message when ``verifier`` cannot verify ``action``'s tree shape."""
    if verifier is None:
        raise UserInputError(f"action {action} drafts a tree; autoregressive decoding has no verifier")
    parents_tree = build_tree(action, np.full(action.tree_size + 1, -1), np.zeros((action.tree_size + 1, 1)))
    if not verifier.supports(parents_tree):
        raise UserInputError(f"method {verifier.name!r} does not support the tree of action {action} "
                         "(chain-only method on a branching tree); use a tree method or K = 1")
