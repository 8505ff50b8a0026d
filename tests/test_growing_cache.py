"""engine/cache.py `GrowingLayer`: the engine's KV cache layer appends into a buffer with room to grow and
still reads, crops, prunes and forks like transformers' `DynamicLayer` (a reference cache fed the same tensors)."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from engine.cache import GrowingLayer, growing_cache


def chunks(seed=0, sizes=(5, 1, 3, 70)):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 2, n, 4, generator=g), torch.randn(1, 2, n, 4, generator=g)) for n in sizes]


def both():
    grown, plain = growing_cache(), DynamicCache()
    for k, v in chunks():
        a, b = grown.update(k, v, 0), plain.update(k, v, 0)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # what attention reads after each append
    return grown, plain


def test_appends_read_like_dynamic_layer_and_grow_past_the_first_buffer():
    grown, plain = both()
    layer = grown.layers[0]
    assert isinstance(layer, GrowingLayer) and grown.get_seq_length() == plain.get_seq_length() == 79
    assert layer._k.buf.shape[2] >= 79  # regrown past the first buffer (5 slots asked for 64)
    assert torch.equal(layer.keys, plain.layers[0].keys) and torch.equal(layer.values, plain.layers[0].values)


def test_crop_by_assignment_shortens_in_place_and_later_appends_overwrite():
    grown, plain = both()
    layer, ref = grown.layers[0], plain.layers[0]
    buffer = layer._k.buf
    layer.keys, layer.values = layer.keys[:, :, :10], layer.values[:, :, :10]  # KVState.crop's assignment
    ref.keys, ref.values = ref.keys[:, :, :10], ref.values[:, :, :10]
    assert layer._k.buf is buffer and layer.get_seq_length() == 10  # no copy
    k, v = chunks(seed=1, sizes=(2,))[0]
    assert torch.equal(grown.update(k, v, 0)[0], plain.update(k, v, 0)[0])


def test_keep_first_reads_like_a_cropped_dynamic_layer_and_keeps_the_buffer():
    for length in (10, 79, 0, 500):  # a cut, all of it, nothing, more than it holds
        grown, plain = both()
        buffer = grown.layers[0]._k.buf
        grown.layers[0].keep_first(length)
        ref = plain.layers[0]
        ref.keys, ref.values = ref.keys[:, :, :length], ref.values[:, :, :length]
        assert grown.layers[0]._k.buf is buffer, length  # no copy, no new view assigned
        assert grown.get_seq_length() == plain.get_seq_length() == min(length, 79), length
        assert torch.equal(grown.layers[0].keys, ref.keys) and torch.equal(grown.layers[0].values, ref.values)
        k, v = chunks(seed=2, sizes=(3,))[0]
        assert torch.equal(grown.update(k, v, 0)[1], plain.update(k, v, 0)[1]), length  # appends after the cut


def test_prune_writes_through_and_a_foreign_tensor_is_copied():
    grown, plain = both()
    for cache in (grown, plain):  # KVState.keep: move slots 20, 30 to 8, 9, then crop to 10
        layer = cache.layers[0]
        idx = torch.tensor([20, 30])
        layer.keys[:, :, 8:10] = layer.keys[:, :, idx]
        layer.values[:, :, 8:10] = layer.values[:, :, idx]
        layer.keys, layer.values = layer.keys[:, :, :10], layer.values[:, :, :10]
    assert torch.equal(grown.layers[0].keys, plain.layers[0].keys)
    assert torch.equal(grown.layers[0].values, plain.layers[0].values)
    foreign = torch.zeros(1, 2, 3, 4)
    grown.layers[0].keys = foreign
    assert grown.layers[0].keys.data_ptr() != foreign.data_ptr() and torch.equal(grown.layers[0].keys, foreign)


def test_an_empty_layer_reads_as_empty():
    cache = growing_cache()
    k, v = chunks(sizes=(3,))[0]
    cache.update(k, v, 0)
    layer = cache.layers[0]
    layer.keys, layer.values = layer.keys[:, :, :0], layer.values[:, :, :0]
    assert layer.keys.numel() == 0 and cache.get_seq_length() == 0


def test_a_buffer_made_under_inference_mode_still_grows_outside_it():
    cache, plain = growing_cache(), DynamicCache()
    (k0, v0), (k1, v1) = chunks(sizes=(4, 2))
    with torch.inference_mode():  # the engine's prefill
        cache.update(k0, v0, 0)
        plain.update(k0, v0, 0)
    keys, _ = cache.update(k1, v1, 0)  # a later step outside inference_mode
    assert torch.equal(keys, plain.update(k1, v1, 0)[0])
