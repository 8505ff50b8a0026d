"""The decode loop: greedy equivalence for every method, EOS/length handling, policies and stats."""

import numpy as np
import pytest
import torch
from engine_helpers import VOCAB, generate, untied_pair

from decoding.actions import Action
from decoding.policy import Policy, RootFeatures
from decoding.sampling import Sampling, transform_logits_np
from engine.decoder import AUTOREGRESSIVE, SpeculativeDecoder
from engine.torch_sampling import transform_logits
from verifiers import METHODS

CHAIN_ONLY = {"naive", "bv"}

pytestmark = pytest.mark.usefixtures("one_thread")


TREE = Action(3, 1, 3)


def action_for(method: str, tree: Action = TREE) -> Action:
    return Action(1, tree.L1, tree.L2) if method in CHAIN_ONLY else tree




@pytest.fixture(scope="module")
def pair():
    return untied_pair(seed=0, noise=0.3)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_greedy_matches_autoregressive_greedy(pair, method):
    target, draft = pair
    rng = np.random.default_rng(3)
    for _ in range(2):
        prompt = rng.integers(3, VOCAB, size=5).tolist()
        ar = generate(target, draft, prompt, 30, method=AUTOREGRESSIVE, sampling=Sampling(0.0))
        for action in (action_for(method), action_for(method, Action(2, 0, 4))):
            sp = generate(target, draft, prompt, 30, method=method, policy=action, sampling=Sampling(0.0), seed=1)
            assert sp.tokens == ar.tokens, (method, action)
            assert sp.stats.steps < ar.stats.steps  # drafts were accepted


def test_autoregressive_greedy_matches_hf_generate(pair):
    target, _ = pair
    prompt = [5, 9, 33, 12]
    ours = generate(target, None, prompt, 20, method=AUTOREGRESSIVE, sampling=Sampling(0.0))
    hf = target.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    assert ours.tokens == hf[0, len(prompt):].tolist()


def test_greedy_rejections_happen(pair):
    """Guard for the greedy test: with these prompts the noisy draft is both accepted and rejected."""
    target, draft = pair
    rng = np.random.default_rng(3)
    hist = np.zeros(5)
    for _ in range(2):
        prompt = rng.integers(3, VOCAB, size=5).tolist()
        h = generate(target, draft, prompt, 30, method="specinfer", policy=Action(3, 1, 3),
                     sampling=Sampling(0.0)).stats.accepted_hist
        hist[:len(h)] += h
    assert hist[0] > 0 and hist[2:].sum() > 0


def test_eos_and_max_new_tokens(pair):
    target, draft = pair
    prompt = [5, 9, 33, 12]
    full = generate(target, draft, prompt, 25, method="traversal", sampling=Sampling(0.0)).tokens
    assert len(full) == 25
    eos = full[7]
    first = full.index(eos)
    cut = SpeculativeDecoder(target, draft, VOCAB, eos_token_ids=[eos]).generate(
        prompt, 25, method="traversal", sampling=Sampling(0.0))
    assert cut.tokens == full[:first + 1]
    for n in (1, 2, 3, 7):
        assert generate(target, draft, prompt, n, method="specinfer", sampling=Sampling(1.0), seed=4).tokens == \
            generate(target, draft, prompt, 25, method="specinfer", sampling=Sampling(1.0), seed=4).tokens[:n]


def test_sampling_is_deterministic_under_a_seed(pair):
    target, draft = pair
    a = generate(target, draft, [3, 4, 5], 30, method="spectr", sampling=Sampling(1.0), seed=7)
    b = generate(target, draft, [3, 4, 5], 30, method="spectr", sampling=Sampling(1.0), seed=7)
    c = generate(target, draft, [3, 4, 5], 30, method="spectr", sampling=Sampling(1.0), seed=8)
    assert a.tokens == b.tokens and a.tokens != c.tokens


class CountingSelector(Policy):
    """A selector that alternates between two actions and records what it saw."""

    needs_hidden_states = True

    def __init__(self):
        self.seen: list[RootFeatures] = []

    def select(self, features: RootFeatures) -> Action:
        self.seen.append(features)
        return Action(2, 1, 2) if len(self.seen) % 2 else Action(1, 0, 0)


def test_selector_policy_and_features(pair):
    target, draft = pair
    selector = CountingSelector()
    prompt = [5, 9, 33, 12]
    res = generate(target, draft, prompt, 20, method="traversal", policy=selector, sampling=Sampling(0.0))
    ar = generate(target, draft, prompt, 20, method=AUTOREGRESSIVE, sampling=Sampling(0.0))
    assert res.tokens == ar.tokens
    assert len(selector.seen) == res.stats.steps
    assert set(res.stats.classes) == {"traversal:2,1,2", "plain"}
    f0 = selector.seen[0]
    assert f0.context_length == len(prompt) - 1
    assert f0.q_root.shape == (VOCAB,) and f0.p_prev.shape == (VOCAB,) and f0.q_prev.shape == (VOCAB,)
    assert f0.h_q_root.shape == (48,) and f0.h_p_prev.shape == (48,)
    # p_prev at step 0 is the target's greedy row after the prompt minus its last token
    with torch.no_grad():
        logits = target(input_ids=torch.tensor([prompt[:-1]])).logits[0, -1]
    np.testing.assert_allclose(f0.p_prev, transform_logits(logits, Sampling(0.0)).numpy())
    for f in selector.seen[1:]:
        assert f.p_prev is not None and f.q_prev is not None


def test_stats_are_consistent(pair):
    target, draft = pair
    res = generate(target, draft, [5, 9, 33, 12], 60, method="specinfer", policy=Action(2, 2, 2),
                   sampling=Sampling(1.0), seed=2)
    s = res.stats
    assert sum(s.accepted_hist) == s.steps and len(s.accepted_hist) <= 5
    assert s.emitted == sum((a + 1) * c for a, c in enumerate(s.accepted_hist))
    assert s.block_efficiency == pytest.approx(s.emitted / s.steps)
    assert s.emitted >= s.new_tokens == 60
    assert len(s.per_depth_acceptance) == 4 and all(0 <= x <= 1 for x in s.per_depth_acceptance)
    d = s.to_dict()
    assert d["time_s"]["total"] >= d["time_s"]["draft"] + d["time_s"]["target"] > 0
    assert "block efficiency" in s.summary()


def test_bad_inputs_fail_clearly(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="chain-only"):
        generate(target, draft, [1, 2], 5, method="bv", policy=Action(2, 1, 2))
    with pytest.raises(ValueError, match="unknown verification method"):
        generate(target, draft, [1, 2], 5, method="magic")
    with pytest.raises(ValueError, match="needs a draft"):
        generate(target, None, [1, 2], 5, method="specinfer")
    with pytest.raises(ValueError, match="at least one token"):
        generate(target, draft, [], 5)
    with pytest.raises(TypeError, match="decoding.policy.Policy"):
        generate(target, draft, [1, 2], 5, policy="2,2,3")


@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.7, 0.9), Sampling(0.0), Sampling(1.3, 0.5)])
def test_sampling_transform_torch_matches_numpy(sampling):
    logits = torch.randn(5, 70, dtype=torch.float64) * 3
    logits[0, :3] = 10.0  # ties
    a = transform_logits(logits, sampling, vocab_size=64).numpy()
    b = transform_logits_np(logits.numpy(), sampling, vocab_size=64)
    np.testing.assert_allclose(a, b, atol=1e-6)
    assert a.shape == (5, 64) and np.allclose(a.sum(-1), 1)
    if sampling.greedy:
        assert (a[0] == np.eye(64)[0]).all()  # lowest token id on ties
    if sampling.top_p < 1:  # the kept set is the smallest set of top tokens reaching top_p
        full = transform_logits_np(logits.numpy(), Sampling(sampling.temperature), 64)
        for row, base in zip(b, full, strict=True):
            kept = np.sort(base[row > 0])
            assert kept.sum() >= sampling.top_p - 1e-9 and kept.sum() - kept[0] < sampling.top_p
            assert base[row == 0].max(initial=0) <= kept[0] + 1e-12


class Returns(Policy):
    """Returns one fixed answer at every step."""

    needs_draft = False

    def __init__(self, answer):
        self.answer = answer

    def select(self, features):
        return self.answer


@pytest.mark.parametrize("answer, match", [
    ("Choice(Action(1, 2, 0), proposal=proposal_tree((4, 5, 6), 8))", "proposal of shape 1,3,0 is not the Choice's "
                                                                      "action 1,2,0"),
    ("Choice(Action(1, 2, 0), proposal=proposal_tree((4, 5), 8), stop_after=bool)", "not both"),
    ("Choice(Action(2, 1, 1), stop_after=bool)", "stop_after drafts the chain"),
    # a chain by is_chain (K = 1), but the stop rule drafts L1 tokens only: 1,2,1 would draft 2 of its 3 (issue #47)
    ("Choice(Action(1, 2, 1), stop_after=bool)", "stop_after drafts the chain 1,L1,0"),
    ("(1, 2, 0)", "not an Action or a Choice"),
])
def test_the_decoder_rejects_an_inconsistent_choice_naming_the_policy(pair, answer, match):
    from decoding.policy import Choice  # noqa: F401 (the answers' names)
    from decoding.tree import proposal_tree  # noqa: F401

    target, draft = pair
    with pytest.raises((ValueError, TypeError), match=match) as err:
        generate(target, draft, [1, 2, 3], 5, method="traversal", policy=Returns(eval(answer)))
    assert "Returns" in str(err.value)


class MethodSwitcher(Policy):
    """Picks the verification method per step too (what a ``method: auto`` selector does)."""

    needs_draft = False

    def __init__(self):
        self.steps = 0

    def select(self, features):
        from decoding.policy import Choice

        self.steps += 1
        assert features.q_root is None and features.p_prev is not None  # target-side features only
        return [Choice(Action(2, 1, 1), "specinfer"), Choice(Action(1, 0, 0)), Choice(Action(1, 2, 0), "bv"),
                Action(3, 0, 2)][self.steps % 4]


def test_selector_choice_switches_methods_and_stays_greedy_exact(pair):
    target, draft = pair
    prompt = [5, 9, 33, 12]
    res = generate(target, draft, prompt, 40, method="traversal", policy=MethodSwitcher(), sampling=Sampling(0.0))
    ar = generate(target, draft, prompt, 40, method=AUTOREGRESSIVE, sampling=Sampling(0.0))
    assert res.tokens == ar.tokens
    assert set(res.stats.methods) == {"specinfer", "bv", "traversal"}
    assert res.stats.classes["plain"] > 0
