"""models/fast_path.py: prepacked linears give the logits of the plain model, keep tied embeddings, pack
shared modules once, leave CUDA / other dtypes alone, and do not break training."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import TINY_VOCAB, tiny_lm
from torch import nn
from transformers import DynamicCache

from models.fast_path import PackedLinear, can_pack, pack_linears, packed_bytes, prepare_for_inference
from models.self_draft import SelfDraft, SelfDraftConfig


def _linears(model: nn.Module, kind: type) -> list[nn.Module]:
    return [m for m in model.modules() if type(m) is kind]


@torch.inference_mode()
def _cached_logits(model, ids: torch.Tensor, split: int) -> torch.Tensor:
    """Logits of ``ids`` [1, n] fed as a prefill of ``split`` tokens, then the rest in one chunk."""
    cache = DynamicCache()
    first = model(input_ids=ids[:, :split], cache=cache, use_cache=True).logits
    rest = model(input_ids=ids[:, split:], cache=cache, use_cache=True).logits
    return torch.cat([first, rest], dim=1)


def test_packed_logits_match_plain_and_embeddings_stay_tied():
    plain = tiny_lm(3, seed=1)
    packed = prepare_for_inference(copy.deepcopy(plain))
    n_plain = len(_linears(plain, nn.Linear))
    assert n_plain > 0 and len(_linears(packed, PackedLinear)) == n_plain
    assert not _linears(packed, nn.Linear)
    assert packed.lm_head.weight is packed.model.embed_tokens.weight  # tied: the lookup sees the plain weight
    ids = torch.randint(0, TINY_VOCAB, (1, 9), generator=torch.Generator().manual_seed(0))
    for split in (1, 5, 8):  # chunks of 8, 4 and 1 tokens after the prefill
        got, want = _cached_logits(packed, ids, split), _cached_logits(plain, ids, split)
        assert torch.allclose(got, want, atol=1e-5), (split, (got - want).abs().max())
    assert packed.state_dict().keys() == plain.state_dict().keys()
    assert packed_bytes(packed) >= sum(m.weight.numel() * 4 for m in _linears(plain, nn.Linear))


def test_real_pair_packed_logits_match_stock(smollm2_pair):
    packed = smollm2_pair.target  # load_pair prepacks on CPU
    assert isinstance(packed.lm_head, PackedLinear) and packed.lm_head.weight is packed.model.embed_tokens.weight
    stock = copy.deepcopy(packed)  # a deep copy is made of plain nn.Linear modules, ties kept
    assert type(stock.lm_head) is nn.Linear and stock.lm_head.weight is stock.model.embed_tokens.weight
    ids = torch.randint(10, 5000, (1, 40), generator=torch.Generator().manual_seed(1))
    got, want = _cached_logits(packed, ids, 36), _cached_logits(stock, ids, 36)
    assert (got - want).abs().max() < 1e-4


def test_self_draft_shares_packed_layers_and_packs_only_its_own():
    target = prepare_for_inference(tiny_lm(4, seed=0, hidden=48))
    draft = SelfDraft(target, SelfDraftConfig(layers=2, adapter_width=16, vocab_subset_size=0))
    assert draft.layers[0].self_attn.q_proj is target.model.layers[0].self_attn.q_proj
    assert pack_linears(draft) == 3  # adapter up/down and the subset head; the shared layers were packed already
    assert pack_linears(target) == 0 and pack_linears(draft) == 0
    assert draft.layers[1].mlp.up_proj is target.model.layers[1].mlp.up_proj


def test_other_devices_and_dtypes_are_left_alone():
    assert not can_pack(torch.device("cuda"), torch.float32)
    assert not can_pack(torch.device("cpu"), torch.bfloat16)
    half = tiny_lm(2, seed=0).to(torch.bfloat16)
    assert pack_linears(half) == 0 and not _linears(half, PackedLinear)


def test_training_through_packed_linears_matches_plain_and_repacks_after_a_step():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(6, 5), nn.SiLU(), nn.Linear(5, 3))
    packed = prepare_for_inference(copy.deepcopy(plain))
    assert isinstance(packed[0], PackedLinear)
    x, y = torch.randn(4, 6), torch.randn(4, 3)
    for model in (plain, packed):
        nn.functional.mse_loss(model(x), y).backward()
    for a, b in zip(plain.parameters(), packed.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)
    opt = torch.optim.SGD(packed.parameters(), lr=0.5)
    opt.step()  # in-place update: the packed copy is stale until the next inference call re-packs it
    with torch.no_grad():
        want = nn.functional.linear(nn.functional.silu(nn.functional.linear(x, packed[0].weight, packed[0].bias)),
                                    packed[2].weight, packed[2].bias)
        assert not torch.allclose(plain(x), want, atol=1e-3)  # the step really moved the output
        assert torch.allclose(packed(x), want, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_model_is_untouched():
    model = tiny_lm(2, seed=0).cuda()
    prepare_for_inference(model)
    assert not _linears(model, PackedLinear)
