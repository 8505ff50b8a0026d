"""Shared fixtures. Tests never touch the network: the hub is switched off before anything imports it."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# numba's cache outside the sources (and so outside every dvc dep), before anything imports numba
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(os.path.dirname(__file__)), ".cache", "numba"))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_pair():
    """The embedded default target, loaded once per session (dequantized and cached on first use)."""
    from models.loading import load_pair

    spec = "embedded:smollm2-135m-instruct"
    return load_pair(spec, spec, device="cpu", dtype="float32")


@pytest.fixture
def one_thread():
    """Tiny models are dominated by thread hand-offs on a busy 2-core box: run them on one thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
