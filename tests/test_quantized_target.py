"""The embedded SmolLM2 target on its own GGUF blocks (`models.quantized`, backend ``int4``): the file's codes
(checked equal to the dense weights), a function within 0.5% held-out perplexity of the float32 model, batch
invariant, and lossless under speculative decoding (greedy identity; chi-square on the first 3 tokens, as
tests/test_engine_lossless.py).

Tolerance: none. A tree pass over n rows and n plain one-row steps reach torch's 4-bit kernel (layers and head)
with different row counts (each row's products do not depend on the others) and attention with different numbers of
keys. Attention runs in float64 (models/lean_layers.py), so its rows round to the same float32; in float32 the last
bits differed, and the bfloat16 rounding of every layer's input grew them to a 1.2% logit difference (total
variation 0.03) on an AVX2 EPYC. So the test requires the logits to be equal, bit for bit.
"""

import numpy as np
import pytest
import torch
from engine_helpers import chain_together_and_apart, noisy_draft
from lossless_harness import PrefixOracle, chi_square_test, expected_law, simulate

from decoding.actions import Action
from decoding.sampling import Sampling
from engine.decoder import AUTOREGRESSIVE, SpeculativeDecoder
from models.int4 import Int4Linear
from models.loading import ModelLoadError, Placement, embedded_gguf_path, load_model
from models.quantized import QuantizedBackendError, backend_of, use_gguf_blocks

SPEC = "embedded:smollm2-135m-instruct"
PROMPT = "Write a Python function that checks whether a number is prime."

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def int4_target():
    return load_model(SPEC, torch.device("cpu"), torch.float32, placement=Placement(backend="int4"))


@pytest.fixture(scope="module")
def prompt_ids(smollm2_pair):
    chat = [{"role": "user", "content": PROMPT}]
    return [int(t) for t in smollm2_pair.tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                                       tokenize=True, return_dict=False)]


def test_every_linear_layer_runs_on_blocks(int4_target):
    layers = [m for m in int4_target.modules() if isinstance(m, Int4Linear) and m.blocks.fmt == "Q4_1"]
    assert len(layers) == 30 * 7  # q k v o gate up down per layer
    head = int4_target.get_output_embeddings()
    assert isinstance(head, Int4Linear) and head.blocks.fmt == "Q8_0" and head.copies == 2  # the tied Q8_0 embedding
    assert backend_of(int4_target) == "int4"
    assert sum(m.bytes_read for m in layers) < 70e6  # 4.5 bits per weight vs ~425 MB of float32 layer weights


def _perplexity(model, ids: list[int]) -> float:
    x = torch.tensor([ids])
    logp = torch.log_softmax(model(x).logits[0, :-1].float(), -1)
    return float(torch.exp(-logp.gather(1, x[0, 1:, None]).mean()))


@torch.inference_mode()
def test_close_to_the_dense_target(smollm2_pair, int4_target, prompt_ids):
    """bfloat16 scales and activations: a slightly different function, within 0.5% perplexity of the dense one
    (docs/engine.md measures 24 held-out prompts: +0.19%)."""
    from data_collection.prompts import load_prompt_set

    text = load_prompt_set("humaneval")["text"][-1]
    ids = smollm2_pair.tokenizer(text)["input_ids"][:256]
    dense, blocks = _perplexity(smollm2_pair.target, ids), _perplexity(int4_target, ids)
    assert abs(blocks / dense - 1) < 0.005, (dense, blocks)
    x = torch.tensor([prompt_ids])
    agree = (int4_target(x).logits.argmax(-1) == smollm2_pair.target(x).logits.argmax(-1)).float().mean()
    assert agree > 0.9


@torch.inference_mode()
def test_tree_pass_and_plain_steps_agree(int4_target, prompt_ids):
    """Batch invariance: 12 chained tokens scored in one pass, then one at a time."""
    together, apart = chain_together_and_apart(int4_target, prompt_ids[:-12], prompt_ids[-12:])
    assert torch.equal(together, apart), (together - apart).abs().max()


def test_weights_that_are_not_the_files_are_refused(prompt_ids):
    model = load_model(SPEC, torch.device("cpu"), torch.float32)  # dense
    with torch.no_grad():
        model.model.layers[3].mlp.up_proj.weight[0, 0] += 1e-3
    with pytest.raises(QuantizedBackendError, match="layer 3 mlp.up_proj"):
        use_gguf_blocks(model, embedded_gguf_path("smollm2-135m-instruct"))


def test_backend_needs_a_gguf_target_on_cpu_float32(tmp_path):
    with pytest.raises(ModelLoadError, match="unknown model backend 'int3'"):
        load_model(SPEC, torch.device("cpu"), torch.float32, placement=Placement(backend="int3"))
    with pytest.raises(ModelLoadError, match="needs an embedded: or gguf: target on CPU in float32"):
        load_model(SPEC, torch.device("cpu"), torch.bfloat16, placement=Placement(backend="int4"))


@pytest.fixture(scope="module")
def int4_decoder(int4_target, smollm2_pair):
    return SpeculativeDecoder(int4_target, noisy_draft(int4_target, 0.5), smollm2_pair.vocab_size)


@pytest.mark.parametrize("method,action", [("traversal", Action(2, 1, 2)), ("specinfer", Action(3, 0, 2)),
                                           ("naive", Action(1, 3, 0))])
def test_greedy_identity_on_blocks(int4_decoder, int4_target, prompt_ids, method, action):
    new = 16
    ar = int4_decoder.generate(prompt_ids, new, AUTOREGRESSIVE, sampling=Sampling(0.0))
    hf = int4_target.generate(torch.tensor([prompt_ids]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
    assert ar.tokens == hf[0, len(prompt_ids):].tolist()
    res = int4_decoder.generate(prompt_ids, new, method, action, Sampling(0.0))
    assert res.tokens == ar.tokens, method
    assert res.stats.steps < new  # drafts were accepted


@pytest.mark.parametrize("method", ["traversal", "specinfer"])
def test_chi_square_on_blocks(int4_target, smollm2_pair, method):
    """The law of the first 3 tokens (9 most likely sequences + rest, N = 2,500: detects a 6% TV shift with
    probability >= 0.9; tests/test_engine_lossless.py has the power computation)."""
    tok = smollm2_pair.tokenizer
    oracle = PrefixOracle(int4_target, noisy_draft(int4_target, 0.5), tok("The capital of France is")["input_ids"],
                          Sampling(0.7, 0.9), smollm2_pair.vocab_size, chunk=128)
    law = expected_law(oracle, 3, 9)
    samples = simulate(oracle, method, Action(2, 1, 2), 2500, 3, np.random.default_rng(5))
    pval, bins = chi_square_test(samples, law)
    assert bins == 10
    assert pval > 1e-3, f"{method}: chi-square p = {pval:.2e}"
