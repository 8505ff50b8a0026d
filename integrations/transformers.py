"""Decode with an exported branchpoint chain selector inside HF transformers' ``generate()``.

transformers' assisted generation verifies one chain per step: greedy by matching, sampling by speculative
sampling (our ``naive``). What of our policy carries over is how many tokens to draft at this step, 0 being a
plain step: the *chain selector* (``branchpoint chain-selector``, folder ``artifacts/selector_chain``,
``"kind": "chain"`` in its sidecar) predicts Ê of the chains ``(1, n, 0)`` and picks the n of the best Ê / T.

Pieces:

- `SelectorCandidateGenerator`, a transformers ``CandidateGenerator``: before each target pass it asks its policy
  for the step and drafts n tokens with `AssistantDrafter`. The policy comes from the registry
  (`policies.registry.build_policy`): the chain selector, or with ``lookup`` the registry's ``prompt_lookup``
  policy with the selector as its fallback (a lookup chain where the context repeats, no draft forward), as our
  headline does. Before transformers' first target pass there is no root row yet: that step is a plain one. The
  policy's inputs come from what ``generate()`` already has: the target's last hidden state at the token
  before the root (the target pass of the step before, ``output_hidden_states``), the root token's input
  embedding, the entropy of the target's distribution at that position after ``generate()``'s logits
  processors (the ``scores`` of ``update_candidate_strategy``), the context length, the sampling settings and a
  latency profile of this machine (`export.runtime.SelectorRuntime`).
- `AssistantDrafter`: the draft. Any module with the HF causal-LM call convention (``model(input_ids=,
  position_ids=, cache= or past_key_values= as its forward names it, use_cache=)`` -> ``.logits``) sharing the target's vocabulary: an HF assistant model,
  or the project's self-draft (`integrations.assistant.self_draft_assistant`), so the default pair works. Its q rows go through the
  same logits processors as the target's, so speculative sampling compares the distributions it samples from.
- `branchpoint_generate(model, inputs, selector=..., assistant=..., **generate_kwargs)`: the entry point; it calls
  ``model.generate(..., custom_generate=BranchpointDecoding(...))``.

Route (transformers 5.24, the pinned range). ``generate(custom_generate=callable)`` is the public hook for a
decoding loop: ``generate()`` prepares the config, logits processors, stopping criteria and cache, then calls it.
`BranchpointDecoding` is that callable, and it runs transformers' own assisted-generation loop
(``GenerationMixin._assisted_decoding``: target pass, acceptance, cache crop, stopping) with our candidate
generator put where that loop asks for one (``model._get_candidate_generator``, shadowed on the instance for
the duration of the call only). Both names are private: transformers has no public way to hand ``generate()``
a candidate generator. The alternatives were worse: an assistant model whose ``generate`` decides the length
never sees the target's hidden state and entropy (the selector's inputs) without an extra target pass, and a
loop of our own would verify with our code, not transformers'. The loop is reused, not copied; a missing name
raises `IntegrationError` naming the version, and tests/test_integration_transformers.py checks on each
install that the generator is really called (greedy identity with ``generate()``, the sampled distribution).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache, GenerationMixin
from transformers.generation.candidate_generator import CandidateGenerator

from decoding.actions import Action
from decoding.errors import UserInputError
from decoding.features import RootFeatures
from decoding.policy import Choice, Policy
from decoding.pricing import kind_counts, step_class
from decoding.sampling import Sampling
from export.runtime import SelectorRuntime, read_sidecar
from models.hf_compat import cache_kwargs
from policies.registry import CHAIN_METHOD, build_policy

CHAIN_KIND = "chain"  # the sidecar's "kind" of a chain selector (pipeline/chain_selector.py)
HOOKS = ("_assisted_decoding", "_get_candidate_generator")  # the private names of transformers used here


class IntegrationError(UserInputError):
    """A selector, model, assistant or argument that cannot decode in transformers; says what to use instead."""


def check_pair(sidecar: dict, model, tokenizer=None, where: str | Path = "selector") -> None:
    """Raise `IntegrationError` unless ``model`` (and ``tokenizer``, when given) is what the selector was trained on:
    the target's hidden size (its ``h_p_prev`` and ``e_root`` inputs), its vocabulary, its tokenizer's length."""
    pair = sidecar.get("pair") or {}
    hidden = (pair.get("hidden_sizes") or {}).get("target")
    if hidden is not None and int(hidden) != int(model.config.hidden_size):
        raise IntegrationError(f"{where}: trained on a target of hidden size {hidden}, this model's is "
                               f"{model.config.hidden_size}; use the selector exported for this model's pair")
    vocab = pair.get("vocab_size")
    rows = int(model.get_output_embeddings().weight.shape[0])
    if vocab is not None and int(vocab) > rows:
        raise IntegrationError(f"{where}: trained on a vocabulary of {vocab} tokens, this model scores {rows}; "
                               "use the selector exported for this model's pair")
    size = pair.get("tokenizer_size")
    if tokenizer is not None and size is not None and len(tokenizer) != int(size):
        raise IntegrationError(f"{where}: trained with a tokenizer of {size} tokens, the one given has "
                               f"{len(tokenizer)}: a different tokenizer; use the selector of this model's pair")


def load_chain_selector(folder: str | Path, model, latency: str | Path | None = None,
                        tokenizer=None) -> SelectorRuntime:
    """The exported chain selector in ``folder`` (as exported, or as ``mlflow artifacts download`` / ``dvc artifacts
    get`` give it), checked against ``model`` (and ``tokenizer``), priced with ``latency`` (this machine's
    ``branchpoint profile`` output; default: the profile embedded at export)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise IntegrationError(f"{folder}: no selector folder; run `branchpoint chain-selector`, or download one "
                               "(`mlflow artifacts download -u models:/branchpoint-chain-selector/<N>`)")
    sidecar = read_sidecar(folder)
    kind = sidecar.get("kind", "tree")
    if kind != CHAIN_KIND:
        raise IntegrationError(f"{folder}: a {kind} selector (it chooses draft trees, {len(sidecar['outputs']['table'])}"
                               " outputs); transformers verifies one chain: use the chain selector (artifacts/"
                               "selector_chain, `branchpoint chain-selector`, registered model branchpoint-chain-selector)")
    if latency is not None and not Path(latency).is_file():
        raise IntegrationError(f"latency profile {latency} not found; run `branchpoint profile` on this machine "
                               "(artifacts/latency.json), or pass latency=None for the profile exported with it")
    if latency is None and not sidecar.get("latency_profile"):
        raise IntegrationError(f"{folder}: the sidecar holds no latency profile; pass latency=<this machine's "
                               "artifacts/latency.json from `branchpoint profile`>")
    check_pair(sidecar, model, tokenizer, folder)
    runtime = build_policy("selector", {"folder": folder, "latency": latency}).policy  # the registry's selector
    if runtime.needs_draft:
        raise IntegrationError(f"{folder}: feature set {runtime.feature_set!r} needs the draft's hidden states, which "
                               "transformers' assistant does not expose; export a target_only chain selector")
    return runtime


class AssistantDrafter:
    """Draws a chain of n tokens from an assistant, keeping its KV cache across steps (cropped to the tokens the
    target accepted). ``logits_processor``: ``generate()``'s, applied to every q row as to the target's p rows."""

    def __init__(self, assistant, logits_processor, do_sample: bool) -> None:
        self.assistant, self.logits_processor, self.do_sample = assistant, logits_processor, bool(do_sample)
        self.cache = DynamicCache()
        self.cached = torch.zeros(0, dtype=torch.long)  # [c] the token ids the cache holds
        self.forwards = 0

    def _forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """``[V]`` float32 logits after ``ids`` ``[1, n]`` fed at positions ``start..``."""
        device = self.assistant.get_input_embeddings().weight.device
        positions = torch.arange(start, start + ids.shape[1], device=device)[None]
        with torch.no_grad():
            out = self.assistant(input_ids=ids.to(device), position_ids=positions, use_cache=True,
                                 **cache_kwargs(self.assistant, self.cache))
        self.forwards += 1
        self.cached = torch.cat([self.cached, ids[0].cpu()])
        return out.logits[0, -1].float()

    def _catch_up(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Crop the cache to its longest prefix shared with ``input_ids`` ``[1, c]`` (leaving the root uncached),
        feed the rest; returns the logits after the root."""
        ids = input_ids[0].cpu()
        n = min(len(self.cached), len(ids) - 1)
        same = int(torch.cumprod((self.cached[:n] == ids[:n]).long(), 0).sum()) if n else 0
        if same < len(self.cached):
            self.cache.crop(same - len(self.cached))  # a negative count: the tokens to drop
            self.cached = self.cached[:same]
        return self._forward(input_ids[:, same:], same)

    def draft(self, input_ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids + n drafted tokens [1, c + n], processed q logits [1, n, V])``."""
        logits = self._catch_up(input_ids)
        ids, rows = input_ids, []
        for i in range(n):
            row = self.logits_processor(ids, logits[None].to(ids.device))  # [1, V]
            rows.append(row)
            tok = (torch.multinomial(row.softmax(-1), 1) if self.do_sample else row.argmax(-1, keepdim=True))
            ids = torch.cat([ids, tok.to(ids.dtype)], dim=1)
            if i + 1 < n:
                logits = self._forward(tok, ids.shape[1] - 1)
        return ids, torch.stack(rows, dim=1)


class SelectorCandidateGenerator(CandidateGenerator):
    """transformers' candidate-generator protocol, with a registry policy (the chain selector, or lookup then the
    selector) choosing each step: a plain step, a lookup chain, or a drafted chain of n tokens."""

    requires_model_outputs = True  # the target's last pass: its hidden states are the selector's input
    model_kwargs_overrides = {"output_hidden_states": True}

    def __init__(self, model, selector, drafter: AssistantDrafter, generation_config,
                 lookup: int | None = None) -> None:
        self.model, self.selector, self.drafter = model, selector, drafter
        self.policy: Policy = (build_policy("prompt_lookup", {"length": lookup, "fallback": selector}).policy
                               if lookup else selector)
        self.max_length = int(generation_config.max_length)
        self.sampling = Sampling(float(generation_config.temperature or 1.0) if generation_config.do_sample else 0.0,
                                 float(generation_config.top_p or 1.0) if generation_config.do_sample else 1.0)
        self.lookup = lookup
        self.p_prev: np.ndarray | None = None  # [V] target distribution the root was drawn from
        self.last_length = 0  # candidates of the previous step
        self.steps: Counter[str] = Counter()  # step class (`decoding.pricing.step_class`) -> steps
        self.drafted = 0

    def steps_by_kind(self) -> dict[str, int]:
        """The steps so far per `decoding.pricing.step_kind`: plain, lookup and drafted."""
        return kind_counts(self.steps)

    @property
    def num_drafting_tokens(self) -> int:
        """The most tokens one step proposes (transformers >= 5.25 sizes the states a cache records with it)."""
        lengths = [a.tree_size for a in getattr(self.selector, "actions", ())]  # a runtime; a test double has none
        return max([*lengths, self.lookup or 0, 1])

    def get_candidates(self, input_ids: torch.LongTensor, model_outputs=None, n_last_matches: int = 0,
                       **_: object) -> tuple[torch.LongTensor, torch.Tensor | None]:
        budget = self.max_length - input_ids.shape[1] - 1  # transformers' own cap: the bonus token must fit
        choice = None
        if budget > 0 and model_outputs is not None:  # before the first target pass: no root row, a plain step
            choice = self.choose(input_ids, model_outputs, int(n_last_matches))
        if choice is not None and choice.proposal is not None:  # a lookup chain, cut to the budget
            proposed = choice.proposal.path_tokens(choice.proposal.num_nodes - 1)[:budget]
            self.last_length = len(proposed)
            self.steps[step_class(Action(1, len(proposed), 0), CHAIN_METHOD, True)] += 1
            tokens = torch.tensor([proposed], dtype=input_ids.dtype, device=input_ids.device)
            return torch.cat([input_ids, tokens], dim=1), None  # one-hot q: transformers matches sampled tokens
        n = min(int(choice.action.tree_size), budget) if choice is not None else 0
        self.last_length = n
        self.steps[step_class(Action(1, n, 0), CHAIN_METHOD, False)] += 1
        if n == 0:
            return input_ids, None
        self.drafted += n
        return self.drafter.draft(input_ids, n)

    def features(self, input_ids: torch.Tensor, model_outputs, n_last_matches: int) -> RootFeatures:
        """The selector's inputs at this root (see the module docstring)."""
        hidden = model_outputs.hidden_states[-1]  # [1, fed, H] of the last target pass
        at = hidden.shape[1] - 1 - self.last_length + n_last_matches  # the position that predicted the root
        ids = input_ids[0].tolist()
        e_root = self.model.get_input_embeddings()(input_ids[:, -1])  # [1, H]
        return RootFeatures(context_length=len(ids) - 1, sampling=self.sampling, p_prev=self.p_prev,
                            h_p_prev=hidden[0, at].float().cpu().numpy(), e_root=e_root[0].float().cpu().numpy(),
                            context=ids)

    def choose(self, input_ids: torch.Tensor, model_outputs, n_last_matches: int) -> Choice:
        """The policy's `Choice` at this root (an `Action` from a bare selector becomes one); a chain, or an error."""
        with torch.no_grad():
            choice = self.policy.select(self.features(input_ids, model_outputs, n_last_matches))
        choice = choice if isinstance(choice, Choice) else Choice(choice)
        if not choice.action.is_chain:
            raise IntegrationError(f"the selector chose {choice.action}, not a chain; use a chain selector")
        return choice

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        """``scores`` ``[1, candidates + 1, V]``: the target's logits after the logits processors; row
        ``num_matches`` is the distribution of the token this step emitted last (the next root)."""
        row = scores[0, int(num_matches)].float()
        if self.sampling.greedy:  # the selector's features see greedy decoding as one-hot rows (decoding.sampling)
            p = torch.zeros_like(row)
            p[row.argmax()] = 1.0
        else:
            p = row.softmax(-1)
        self.p_prev = p.cpu().numpy()


class BranchpointDecoding:
    """The ``custom_generate`` callable: transformers' assisted-generation loop with `SelectorCandidateGenerator`
    (see the module docstring for why this route). ``last_generator`` keeps the last call's step counts."""

    def __init__(self, selector, assistant, lookup: int | None = None) -> None:
        missing = [h for h in HOOKS if not hasattr(GenerationMixin, h)]
        if missing:
            import transformers

            raise IntegrationError(f"transformers {transformers.__version__} has no {missing} (used by the tested "
                                   "5.x range); install the version in pyproject.toml")
        self.selector, self.assistant = selector, assistant
        self.lookup = lookup
        self.last_generator: SelectorCandidateGenerator | None = None

    def __call__(self, model, input_ids, logits_processor, generation_config, **loop_kwargs):
        """generate()'s call of a decoding loop; ``loop_kwargs`` (stopping criteria, streamer, model inputs...) go to
        transformers' assisted-decoding loop as generate() hands them."""
        if input_ids.shape[0] != 1:
            raise IntegrationError(f"assisted generation decodes one sequence at a time, got a batch of "
                                   f"{input_ids.shape[0]}")
        drafter = AssistantDrafter(self.assistant, logits_processor, generation_config.do_sample)
        generator = SelectorCandidateGenerator(model, self.selector, drafter, generation_config, self.lookup)
        self.last_generator = generator
        model._get_candidate_generator = lambda *args, **kwargs: generator  # this call only (see module docstring)
        try:
            return model._assisted_decoding(input_ids, logits_processor=logits_processor,
                                            generation_config=generation_config, **loop_kwargs)
        finally:
            del model._get_candidate_generator


def check_assistant(model, assistant) -> None:
    """Raise `IntegrationError` unless ``assistant`` scores the target's vocabulary (one token space)."""
    if assistant is None:
        raise IntegrationError("pass assistant=: an HF causal LM with the target's tokenizer, or the self-draft "
                               "(integrations.assistant.self_draft_assistant(model, 'artifacts/draft'))")
    rows = getattr(getattr(assistant, "config", None), "vocab_size", None)
    if rows is None and hasattr(assistant, "get_output_embeddings"):
        rows = assistant.get_output_embeddings().weight.shape[0]
    if rows is not None and int(rows) != int(model.config.vocab_size):
        raise IntegrationError(f"the assistant scores {rows} tokens, the target {model.config.vocab_size}: they do "
                               "not share a vocabulary (a different tokenizer); use an assistant of the target's family")


def branchpoint_generate(model, inputs=None, selector: str | Path | SelectorRuntime = "artifacts/selector_chain",
                         assistant=None, lookup: int | None = None, **generate_kwargs):
    """``model.generate(inputs, **generate_kwargs)`` with the chain selector choosing each step's draft length (and,
    with ``lookup = N``, prompt lookup chains of up to N tokens where the context repeats). Lossless: greedy gives
    ``generate()``'s tokens, sampling its distribution. ``selector``: a chain selector folder (priced with the
    profile embedded at export), or `load_chain_selector`'s runtime, which also takes this machine's profile and
    checks a tokenizer."""
    for key in ("assistant_model", "prompt_lookup_num_tokens", "custom_generate"):
        if generate_kwargs.get(key) is not None:
            raise IntegrationError(f"branchpoint_generate chooses the candidates itself; drop {key}=")
    check_assistant(model, assistant)
    runtime = load_chain_selector(selector, model) if isinstance(selector, str | Path) else selector
    decoding = BranchpointDecoding(runtime, assistant, lookup)
    return model.generate(inputs, custom_generate=decoding, **generate_kwargs)
