"""Statistical losslessness of speculative decoding on real models (ALGORITHMS.md section 7).

For a fixed prompt, the law of the first 3 emitted tokens under speculative decoding (every registry
method; a delayed action ``(2, 1, 2)``, chain-only methods ``(1, 1, 2)``) must equal the target's law
under the same sampling transform. Test: chi-square goodness of fit on the 9 most likely 3-token
sequences plus one rest bin (10 bins), p > 0.001.

Power (see tests/lossless_harness.py): any shift of total variation TV between the binned laws has
noncentrality >= 4 N TV^2, so with 10 bins at alpha = 0.001
- N = 21,500 samples (the slow suite) detect a 2% TV shift with probability >= 0.90;
- N = 2,500 samples (the fast CI suite) detect a 6% TV shift with probability >= 0.90 (2%: ~0.03).
The samples come from `lossless_harness.simulate` (rows of each distinct prefix computed once with the
engine's tree pass, draft trees and verification per sample); `test_generate_end_to_end_*` also runs
the real decode loop (`SpeculativeDecoder.generate`) sample by sample, with lower power.
"""

import numpy as np
import pytest
from engine_helpers import VOCAB, noisy_draft, untied_pair
from lossless_harness import (
    PrefixOracle,
    chi_square_power,
    chi_square_test,
    expected_law,
    samples_for_power,
    simulate,
)

from decoding.actions import Action
from decoding.sampling import Sampling
from engine.decoder import SpeculativeDecoder
from verifiers import METHODS

ALPHA = 1e-3
TOP = 9  # listed sequences; + 1 rest bin
N_FAST = 2500
N_SLOW = samples_for_power(TOP + 1, power=0.9, tv=0.02, alpha=ALPHA)  # 21,500
TREE, CHAIN = Action(2, 1, 2), Action(1, 1, 2)
TINY_PROMPT = [5, 9, 33, 12]
TINY_SAMPLING = Sampling(0.8, 0.95)  # top-p puts zeros into p and q

pytestmark = pytest.mark.usefixtures("one_thread")


def action_for(method: str) -> Action:
    return CHAIN if METHODS[method].chains_only else TREE




@pytest.fixture(scope="module")
def tiny_oracle():
    target, draft = untied_pair(seed=1, noise=0.6, head_scale=10.0)
    return PrefixOracle(target, draft, TINY_PROMPT, TINY_SAMPLING, VOCAB)


def test_power_of_the_sample_sizes():
    assert N_SLOW <= 22_000
    assert chi_square_power(N_SLOW, TOP + 1, tv=0.02, alpha=ALPHA) >= 0.9
    assert chi_square_power(N_FAST, TOP + 1, tv=0.06, alpha=ALPHA) >= 0.9


def _check(oracle, method, n, seed):
    law = expected_law(oracle, 3, TOP)
    samples = simulate(oracle, method, action_for(method), n, 3, np.random.default_rng(seed))
    pval, bins = chi_square_test(samples, law)
    assert bins == TOP + 1, f"{bins} bins: a listed sequence has expected count < 5"
    assert pval > ALPHA, f"{method}: chi-square p = {pval:.2e} over {bins} bins, {n} samples"
    return samples


@pytest.mark.parametrize("method", sorted(METHODS))
def test_lossless_tiny_pair_fast(tiny_oracle, method):
    _check(tiny_oracle, method, N_FAST, seed=11)


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(METHODS))
def test_lossless_tiny_pair_full_power(tiny_oracle, method):
    _check(tiny_oracle, method, N_SLOW, seed=12)


def test_the_check_detects_a_lossy_verifier(tiny_oracle):
    """Power in practice: accepting every draft token (no verification) is caught."""
    from verifiers.registry import BottomUpMethod

    def accept_all(tree, p_rows, rng):
        node, path = 0, []
        while tree.children[node]:
            node = tree.children[node][0]
            path.append(node)
        return path, int(np.argmax(p_rows[node]))

    fake = BottomUpMethod("accept_all", accept_all, None)
    METHODS["accept_all"] = fake
    try:
        law = expected_law(tiny_oracle, 3, TOP)
        samples = simulate(tiny_oracle, "accept_all", TREE, N_FAST, 3, np.random.default_rng(0))
        assert chi_square_test(samples, law)[0] < ALPHA
    finally:
        del METHODS["accept_all"]


@pytest.mark.parametrize("method", ["traversal"])
def test_generate_end_to_end_tiny_pair(method):
    """The real decode loop, one sample per seed: first 2 tokens vs the target law (power: detects a
    TV shift of ~20% with probability 0.9 at 300 samples; the harness tests above carry the power)."""
    target, draft = untied_pair(seed=1, noise=0.6, head_scale=10.0)
    oracle = PrefixOracle(target, draft, TINY_PROMPT, TINY_SAMPLING, VOCAB)
    law = expected_law(oracle, 2, 6)
    decoder = SpeculativeDecoder(target, draft, VOCAB)
    samples = [tuple(decoder.generate(TINY_PROMPT, 2, method, TREE, TINY_SAMPLING, seed=s).tokens)
               for s in range(300)]
    pval, bins = chi_square_test(samples, law)
    assert bins >= 3 and pval > ALPHA


# ---- the embedded SmolLM2 pair: SmolLM2-135M target, a noisy copy as draft (engine_helpers.noisy_draft) ----

SMOL_SAMPLING = Sampling(0.7, 0.9)


@pytest.fixture(scope="module")
def smol_oracle(smollm2_pair):
    tok = smollm2_pair.tokenizer
    prompt = tok("The capital of France is")["input_ids"]
    draft = noisy_draft(smollm2_pair.target, 0.5)
    return PrefixOracle(smollm2_pair.target, draft, prompt, SMOL_SAMPLING, smollm2_pair.vocab_size, chunk=128)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(METHODS))
def test_lossless_smollm2_full_power(smol_oracle, method):
    _check(smol_oracle, method, N_SLOW, seed=13)
