"""Our top-level package names are generic (models, pipeline, export...): make sure they are ours."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


OURS = ["decoding", "verifiers", "engine", "models", "selector", "data_collection", "evaluation", "pipeline", "export",
        "policies", "integrations"]


@pytest.mark.parametrize("package", OURS)
def test_package_resolves_to_this_repository(package):
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).resolve().is_relative_to(ROOT), f"{package} is shadowed by {spec.origin}"


def test_no_installed_distribution_claims_our_names():
    import importlib.metadata

    ours = set(OURS)
    for dist in importlib.metadata.distributions():
        if dist.metadata["Name"] == "branchpoint":
            continue
        top = dist.read_text("top_level.txt") or ""
        clash = ours & set(top.split())
        assert not clash, f"distribution {dist.metadata['Name']} also installs {clash}"


# Each layer imports only the layers below it (docs/architecture.md). decoding/ and verifiers/ are one layer in two
# packages (labels need the verifiers, the verifiers need trees), split so that dvc reruns only the stages that verify.
# export/ (the ONNX selector and its torch-free runtime) sits below policies/ (the policies above the engine and their
# registry), which sits below evaluation/, which decodes them; neither imports data_collection/ or evaluation/. integrations/ (our selectors in other
# runtimes) is a top layer beside pipeline/: nothing imports it, and it never imports our decoder (engine),
# a stage or the evaluation: a runtime needs only the exported selector and the numpy modules.
FORBIDDEN = {
    "decoding": {"engine", "models", "selector", "data_collection", "evaluation", "pipeline", "export", "policies",
                 "integrations"},
    "verifiers": {"engine", "models", "selector", "data_collection", "evaluation", "pipeline", "export", "policies",
                  "integrations"},
    "engine": {"models", "selector", "data_collection", "evaluation", "pipeline", "export", "policies", "integrations"},
    "models": {"selector", "data_collection", "evaluation", "pipeline", "export", "policies", "integrations"},
    "selector": {"engine", "verifiers", "models", "data_collection", "evaluation", "pipeline", "export", "policies",
                 "integrations"},
    "data_collection": {"evaluation", "pipeline", "export", "policies", "integrations"},
    "evaluation": {"pipeline", "integrations"},
    "export": {"engine", "selector", "data_collection", "evaluation", "pipeline", "policies", "integrations"},
    "policies": {"engine", "models", "data_collection", "evaluation", "pipeline", "integrations"},
    "pipeline": {"integrations"},
    "integrations": {"engine", "data_collection", "evaluation", "pipeline"},
}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_import_only_layers_below(layer):
    import ast

    bad = []
    for path in (ROOT / layer).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            bad += [f"{path.relative_to(ROOT)}: {n}" for n in names
                    if any(n == f or n.startswith(f + ".") for f in FORBIDDEN[layer])]
    assert not bad, f"{layer} imports layers above it: {bad}"
