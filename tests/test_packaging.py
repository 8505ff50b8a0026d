"""Our top-level package names are generic (models, pipeline, export...): make sure they are ours."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("package", ["decoding", "models", "data_collection", "pipeline", "export"])
def test_package_resolves_to_this_repository(package):
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).resolve().is_relative_to(ROOT), f"{package} is shadowed by {spec.origin}"


def test_no_installed_distribution_claims_our_names():
    import importlib.metadata

    ours = {"decoding", "models", "data_collection", "pipeline", "export"}
    for dist in importlib.metadata.distributions():
        if dist.metadata["Name"] == "branchpoint":
            continue
        top = dist.read_text("top_level.txt") or ""
        clash = ours & set(top.split())
        assert not clash, f"distribution {dist.metadata['Name']} also installs {clash}"
