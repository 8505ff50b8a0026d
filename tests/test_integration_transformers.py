"""integrations/transformers.py: HF generate() decoding with an exported chain selector (tiny random models)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_helpers import VOCAB, untied_pair
from selector_helpers import random_inputs, toy_latency
from tiny_models import tiny_config, tiny_tokenizer
from transformers import LlamaForCausalLM

from decoding import pricing
from decoding.actions import Action
from decoding.features import FeatureSchema
from decoding.policy import StaticPolicy
from export.onnx_export import export_selector
from integrations.transformers import (
    BranchpointDecoding,
    IntegrationError,
    branchpoint_generate,
    load_chain_selector,
)
from policies.lookup import LookupFirst
from selector.network import NetShape, OutputLayout, SelectorNet

CHAINS = tuple(Action(1, n, 0) for n in range(5))
PROMPT = [[1, 7, 9, 11, 7, 9, 13, 21, 30, 7, 9]]


def export_chain(folder, hidden: int, vocab: int, kind: str = "chain", labels=(1.0, 1.8, 2.5, 3.1, 3.5),
                 latency: bool = True):
    """A tiny target_only selector over CHAINS whose predicted Ê is ``labels`` whatever the features (weights of the
    last layer zeroed), exported like `branchpoint chain-selector` does."""
    torch.manual_seed(0)
    schema = FeatureSchema.for_pair("target_only", hidden, hidden)
    layout = OutputLayout(("specinfer",), CHAINS)
    tied, fixed = layout.constraints()
    net = SelectorNet({h: schema.input_shapes()[h][0] for h in schema.hidden}, len(schema.scalars), layout.size,
                      NetShape(8, (16, 8), 0.0), tied=tied, fixed=fixed).eval()
    with torch.no_grad():
        net.mlp[-1].weight.zero_()
        net.mlp[-1].bias.copy_(torch.tensor(labels))
    meta = {"kind": kind, "feature_set": "target_only", "schema": schema.to_dict(), "objective": "regression",
            "outputs": {"methods": ["specinfer"], "actions": [str(a) for a in CHAINS], "auto": False,
                        "valid": [True] * len(CHAINS)},
            "latency": toy_latency().to_dict() if latency else None, "architecture": net.architecture,
            "pair": {"target": "tiny", "draft": "tiny-noisy", "vocab_size": vocab, "tokenizer_size": vocab,
                     "hidden_sizes": {"target": hidden, "draft": hidden}}}
    inputs = random_inputs(schema, 16)
    ctx = inputs["scalars"][:, schema.scalars.index("context_length")]
    seconds = pricing.step_seconds(toy_latency(), ctx, list(CHAINS), ["specinfer"], "target_only").astype(np.float32)
    export_selector(net, meta, folder, inputs, seconds)
    return folder


@pytest.fixture(scope="module")
def pair():
    return untied_pair(seed=3, noise=0.3)


@pytest.fixture(scope="module")
def chain_folder(tmp_path_factory, pair):
    return export_chain(tmp_path_factory.mktemp("chain") / "selector_chain", pair[0].config.hidden_size, VOCAB)


class Recording:
    """A selector that records what it was asked and answers like the wrapped one."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def select(self, features):
        self.seen.append(features)
        return self.inner.select(features)


def test_greedy_is_token_identical_to_generate(pair, chain_folder):
    target, draft = pair
    ids = torch.tensor(PROMPT)
    plain = target.generate(ids, do_sample=False, max_new_tokens=48, min_new_tokens=48)
    selector = Recording(load_chain_selector(chain_folder, target))
    decoding = BranchpointDecoding(selector, draft)
    ours = target.generate(ids, do_sample=False, max_new_tokens=48, min_new_tokens=48, custom_generate=decoding)
    assert ours.tolist() == plain.tolist()
    gen = decoding.last_generator
    kinds = gen.steps_by_kind()
    assert kinds["draft"] > 0 and gen.drafted > kinds["draft"]  # it drafted chains, not plain steps
    assert len(selector.seen) == kinds["draft"] + kinds["plain"] - 1  # asked at every step but the first
    assert set(gen.steps) <= {"plain"} | {f"naive:1,{n},0" for n in range(1, 9)}  # `pricing.step_class` keys
    decoding = BranchpointDecoding(load_chain_selector(chain_folder, target), draft, lookup=3)
    with_lookup = target.generate(ids, do_sample=False, max_new_tokens=48, min_new_tokens=48, custom_generate=decoding)
    assert with_lookup.tolist() == plain.tolist()
    gen = decoding.last_generator
    assert isinstance(gen.policy, LookupFirst) and gen.policy.length == 3  # the registry's prompt_lookup policy
    assert gen.steps_by_kind()["lookup"] > 0 and gen.steps_by_kind()["draft"] > 0  # both of its branches ran
    assert {k for k in gen.steps if k.startswith("lookup:")} <= {"lookup:1", "lookup:2", "lookup:3"}


def test_the_selector_sees_the_targets_own_features(pair, chain_folder):
    """h_p_prev, e_root and H(p_prev) handed to the selector are what a fresh target forward over the context gives
    at the token before the root (a wrong index into the last pass's hidden states fails here)."""
    target, draft = pair
    selector = Recording(load_chain_selector(chain_folder, target))
    torch.manual_seed(1)
    target.generate(torch.tensor(PROMPT), do_sample=True, temperature=0.8, top_k=0, top_p=1.0, max_new_tokens=24,
                    custom_generate=BranchpointDecoding(selector, draft))
    assert len(selector.seen) >= 4
    for f in selector.seen:
        ids = torch.tensor([list(f.context)])
        with torch.no_grad():
            out = target(ids, output_hidden_states=True)
        np.testing.assert_allclose(f.h_p_prev, out.hidden_states[-1][0, -2].numpy(), atol=1e-4)
        np.testing.assert_allclose(f.e_root, target.get_input_embeddings()(ids[0, -1]).detach().numpy(), atol=1e-6)
        np.testing.assert_allclose(f.p_prev, (out.logits[0, -2] / 0.8).softmax(-1).numpy(), atol=1e-5)
        assert f.context_length == ids.shape[1] - 1 and f.sampling.temperature == pytest.approx(0.8)


def _small_vocab_pair(vocab: int = 5):
    """A target and an independent draft over ``vocab`` tokens: drafts are often rejected, so the residual
    draws of speculative sampling are exercised as much as the acceptances."""
    models = []
    for seed in (11, 12):
        torch.manual_seed(seed)
        config = tiny_config(2, hidden=32, vocab=vocab)
        config.tie_word_embeddings = False  # a head of its own: a tied one mostly repeats the last token
        m = LlamaForCausalLM(config).eval()
        with torch.no_grad():
            m.lm_head.weight.mul_(6.0)
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
        models.append(m)
    return tuple(models)


def _joint(model, prompt: list[int], vocab: int) -> np.ndarray:
    """``[V, V]`` exact P(first two tokens) under plain sampling at T = 1."""
    with torch.no_grad():
        p1 = model(torch.tensor([prompt])).logits[0, -1].softmax(-1)
        rows = torch.tensor([[*prompt, x] for x in range(vocab)])
        p2 = model(rows).logits[:, -1].softmax(-1)
    return (p1[:, None] * p2).double().numpy()


def _chi2_pvalue(counts: np.ndarray, expected_p: np.ndarray) -> float:
    from scipy.stats import chi2

    n = counts.sum()
    exp = expected_p.ravel() * n
    obs = counts.ravel()
    big = exp >= 5
    obs_b = np.append(obs[big], obs[~big].sum())
    exp_b = np.append(exp[big], exp[~big].sum())
    keep = exp_b > 0
    stat = float(((obs_b[keep] - exp_b[keep]) ** 2 / exp_b[keep]).sum())
    return float(chi2.sf(stat, keep.sum() - 1))


def test_first_two_tokens_at_t1_follow_plain_sampling():
    """Chi-square of the first two tokens' joint distribution (25 cells) against the target's exact one; the same
    samples must reject what a sampler that kept the draft's second token unverified would produce (simulated with
    these models: rejected in 100% of 200 draws of 300 samples, while the right one was in 0%)."""
    vocab, n = 5, 400
    target, draft = _small_vocab_pair(vocab)
    prompt = [3, 4, 1, 3, 4]
    decoding = BranchpointDecoding(StaticPolicy(Action(1, 3, 0)), draft)  # drafts 3 tokens at every step but the first
    counts = np.zeros((vocab, vocab))
    torch.manual_seed(0)
    ids = torch.tensor([prompt])
    for _ in range(n):
        out = target.generate(ids, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=4,
                              custom_generate=decoding)  # 4: a second step with room to draft
        x1, x2 = out[0, len(prompt):len(prompt) + 2].tolist()
        counts[x1, x2] += 1
    assert decoding.last_generator.steps_by_kind()["draft"] >= 1  # the second token came from a verified draft
    p = _joint(target, prompt, vocab)
    q2 = np.stack([_joint(draft, prompt, vocab)[x] / _joint(draft, prompt, vocab)[x].sum() for x in range(vocab)])
    wrong = p.sum(axis=1, keepdims=True) * q2  # x1 ~ p, x2 ~ q(.|x1): the draft's token accepted unverified
    assert np.abs(wrong - p).sum() > 0.5  # the pair differs enough for the check to mean something
    assert _chi2_pvalue(counts, p) > 1e-3
    assert _chi2_pvalue(counts, wrong) < 1e-6


def test_a_tree_selector_folder_is_refused(pair, tmp_path):
    folder = export_chain(tmp_path / "tree", pair[0].config.hidden_size, VOCAB, kind="tree")
    with pytest.raises(IntegrationError, match="a tree selector.*use the chain selector"):
        load_chain_selector(folder, pair[0])
    side = json.loads((folder / "selector.json").read_text())
    del side["kind"]  # exported before kinds existed: a tree selector
    (folder / "selector.json").write_text(json.dumps(side))
    with pytest.raises(IntegrationError, match="a tree selector"):
        branchpoint_generate(pair[0], torch.tensor(PROMPT), selector=folder, assistant=pair[1], max_new_tokens=4)


def test_another_pair_or_tokenizer_is_refused(pair, chain_folder):
    target, draft = pair
    with pytest.raises(IntegrationError, match="tokenizer of 64 tokens, the one given has 70"):
        load_chain_selector(chain_folder, target, tokenizer=tiny_tokenizer(70))
    other = LlamaForCausalLM(tiny_config(1, hidden=32)).eval()
    with pytest.raises(IntegrationError, match="hidden size 48"):
        load_chain_selector(chain_folder, other)
    small = LlamaForCausalLM(tiny_config(1, hidden=48, vocab=32)).eval()
    with pytest.raises(IntegrationError, match="vocabulary of 64 tokens"):
        load_chain_selector(chain_folder, small)
    with pytest.raises(IntegrationError, match="do not share a vocabulary"):
        branchpoint_generate(target, torch.tensor(PROMPT), selector=chain_folder, assistant=small, max_new_tokens=4)
    with pytest.raises(IntegrationError, match="pass assistant="):
        branchpoint_generate(target, torch.tensor(PROMPT), selector=chain_folder, max_new_tokens=4)
    with pytest.raises(IntegrationError, match="drop prompt_lookup_num_tokens"):
        branchpoint_generate(target, torch.tensor(PROMPT), selector=chain_folder, assistant=draft,
                             prompt_lookup_num_tokens=3)
    with pytest.raises(IntegrationError, match="one sequence at a time"):
        branchpoint_generate(target, torch.tensor(PROMPT * 2), selector=chain_folder, assistant=draft, max_new_tokens=4)


def test_a_missing_latency_profile_is_refused(pair, chain_folder, tmp_path):
    with pytest.raises(IntegrationError, match="latency profile .*nope.json not found; run `branchpoint profile`"):
        load_chain_selector(chain_folder, pair[0], latency=tmp_path / "nope.json")
    bare = export_chain(tmp_path / "bare", pair[0].config.hidden_size, VOCAB, latency=False)
    with pytest.raises(IntegrationError, match="holds no latency profile"):
        load_chain_selector(bare, pair[0])
    profile = toy_latency().save(tmp_path / "latency.json")
    assert load_chain_selector(bare, pair[0], latency=profile).latency is not None
    with pytest.raises(IntegrationError, match="no selector folder"):
        load_chain_selector(tmp_path / "absent", pair[0])


def test_the_selector_comes_from_the_policy_registry(pair, chain_folder, monkeypatch):
    """One meaning for "selector": the integration builds it with `policies.registry.build_policy`, as decode and
    evaluate do."""
    from policies import registry as policies

    built = []
    registered = policies.POLICIES["selector"]
    monkeypatch.setitem(policies.POLICIES, "selector", lambda cfg: built.append(dict(cfg)) or registered(cfg))
    runtime = load_chain_selector(chain_folder, pair[0])
    assert [Path(b["folder"]) for b in built] == [Path(chain_folder)]
    assert runtime.sidecar["kind"] == "chain"


def test_the_self_draft_is_an_assistant_for_both_transformers_and_the_selector(pair, chain_folder):
    """The self-draft wrapped as an HF model: transformers' own assisted generation and branchpoint_generate both
    decode with it, greedy token-identical to plain generate()."""
    from integrations.assistant import SelfDraftAssistant
    from models.self_draft import SelfDraft, SelfDraftConfig

    target = pair[0]
    assistant = SelfDraftAssistant(SelfDraft(target, SelfDraftConfig(layers=2, adapter_width=8,
                                                                     vocab_subset_size=40)).eval(), target)
    ids = torch.tensor(PROMPT)
    kw = {"do_sample": False, "max_new_tokens": 32, "min_new_tokens": 32}
    plain = target.generate(ids, **kw).tolist()
    assert target.generate(ids, assistant_model=assistant, **kw).tolist() == plain
    assert branchpoint_generate(target, ids, selector=chain_folder, assistant=assistant, **kw).tolist() == plain


@pytest.mark.slow  # the embedded SmolLM2-135M target, 128 tokens three times: ~1-2 minutes on 2 cores
@pytest.mark.integration
def test_greedy_on_the_real_pair_is_token_identical(smollm2_pair, tmp_path):
    """The default pair's target with its (untrained) self-draft as the assistant, and a chain selector of its
    shapes: greedy branchpoint_generate (with and without lookup) gives plain generate()'s 128 tokens."""
    from integrations.assistant import SelfDraftAssistant
    from models.self_draft import SelfDraft, SelfDraftConfig

    target, tok = smollm2_pair.target, smollm2_pair.tokenizer
    folder = export_chain(tmp_path / "chain", target.config.hidden_size, target.config.vocab_size)
    side = json.loads((folder / "selector.json").read_text())
    side["pair"]["tokenizer_size"] = len(tok)
    (folder / "selector.json").write_text(json.dumps(side))
    draft = SelfDraftAssistant(SelfDraft(target, SelfDraftConfig(layers=8, adapter_width=64,
                                                                 vocab_subset_size=8192)).eval(), target)
    ids = tok("def fibonacci(n):\n    # return the n-th Fibonacci number\n", return_tensors="pt").input_ids
    kw = {"do_sample": False, "max_new_tokens": 128, "min_new_tokens": 128}
    plain = target.generate(ids, **kw).tolist()
    for lookup in (None, 4):
        ours = branchpoint_generate(target, ids, selector=load_chain_selector(folder, target, tokenizer=tok),
                                    assistant=draft, lookup=lookup, **kw)
        assert ours.tolist() == plain
