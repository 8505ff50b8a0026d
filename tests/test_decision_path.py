"""How many of our modules one decision opens: the default policy (the exported selector behind prompt lookup's
rule) followed from `SpeculativeDecoder.step` until the step's `Choice` is made, traced with ``sys.setprofile``.

docs/architecture.md lists these modules ("One decoding step"); this test keeps that list true and short. Five in
the steady state of a selector step (the decoder, which also checks the `Choice` it gets; the lookup rule; the
runtime; the features; the latency profile's memo of root step times and prices), four for a lookup step (the
lookup rule builds its chain's tree); the first step of a block of context lengths also prices it
(`decoding/pricing.py`).
"""

import sys
from pathlib import Path

import pytest
from engine_helpers import VOCAB, untied_pair
from selector_helpers import random_inputs, random_selector, toy_latency

from decoding import pricing
from decoding.sampling import Sampling
from engine.decoder import SpeculativeDecoder
from policies.lookup import LookupFirst

ROOT = Path(__file__).resolve().parents[1]
DECISION_MODULES = {"engine/decoder.py", "policies/lookup.py", "export/runtime.py", "decoding/features.py",
                    "decoding/latency.py"}
LOOKUP_STEP = {"engine/decoder.py", "policies/lookup.py", "decoding/actions.py", "decoding/tree.py"}


def _ours(filename: str) -> str | None:
    path = Path(filename)
    if not path.is_absolute() or ".venv" in path.parts or "site-packages" in path.parts:
        return None
    try:
        rel = path.resolve().relative_to(ROOT)
    except ValueError:
        return None
    return None if rel.parts[0] == "tests" else str(rel)


@pytest.fixture(scope="module")
def selector(tmp_path_factory):
    from selector_helpers import SPACE

    from export.onnx_export import export_selector
    from export.runtime import SelectorRuntime

    target, _ = untied_pair()
    hidden = target.config.hidden_size
    net, meta, schema = random_selector("target_only", hidden=(hidden, hidden))
    inputs = random_inputs(schema, 32, seed=1)
    ctx = inputs["scalars"][:, schema.scalars.index("context_length")].astype(int)
    seconds = pricing.step_seconds(toy_latency(), ctx, list(SPACE), ["traversal"], "target_only").astype("float32")
    folder = tmp_path_factory.mktemp("sel") / "selector"
    export_selector(net, meta, folder, inputs, seconds)
    return SelectorRuntime(folder, latency=toy_latency())


def test_a_selector_decision_opens_five_of_our_modules_a_lookup_step_four(selector):
    target, draft = untied_pair()
    policy = LookupFirst(selector, length=4)
    decoder = SpeculativeDecoder(target, draft, VOCAB)
    seen: list[set] = []
    original = policy.select

    def traced_select(features):  # the decision: from the decoder's call into the policy until its Choice
        calls: set = set()

        def hook(frame, event, arg):
            if event in ("call", "c_call"):
                mod = _ours(frame.f_code.co_filename)
                if mod:
                    calls.add(mod)

        sys.setprofile(hook)
        try:
            return original(features)
        finally:
            sys.setprofile(None)
            seen.append(calls | {"engine/decoder.py"})  # and the caller

    policy.select = traced_select
    # a context without repeats first (the selector decides), then decode on
    decoder.generate(list(range(3, 40)), 24, "traversal", policy, Sampling(1.0, 1.0), seed=0)
    assert len(seen) >= 4
    first, rest = seen[0], seen[1:]
    assert first == DECISION_MODULES | {"decoding/pricing.py"}, sorted(first)  # the first block of prices
    selector_steps = [s for s in rest if "export/runtime.py" in s]
    lookup_steps = [s for s in rest if "export/runtime.py" not in s]
    assert selector_steps and lookup_steps
    for touched in selector_steps:
        assert touched == DECISION_MODULES, sorted(touched ^ DECISION_MODULES)
    for touched in lookup_steps:
        assert touched == LOOKUP_STEP, sorted(touched ^ LOOKUP_STEP)


# A whole step of the default policy on the tiny HF pair (the embedded target adds models/lean_layers.py and
# models/int4.py): the decision above, then drafting, the tree pass, verification (Traversal), pruning and the step's
# stats. docs/architecture.md ("One decoding step") gives these counts; a step that grows past them fails here.
WHOLE_STEP = {"selector": 20, "lookup": 15}


def test_a_whole_step_stays_within_its_module_count(selector):
    target, draft = untied_pair()
    decoder = SpeculativeDecoder(target, draft, VOCAB)
    seen: list[set] = []
    original = SpeculativeDecoder.step

    def traced_step(self, state, run):
        calls: set = set()

        def hook(frame, event, arg):
            if event == "call":
                mod = _ours(frame.f_code.co_filename)
                if mod:
                    calls.add(mod)

        sys.setprofile(hook)
        try:
            return original(self, state, run)
        finally:
            sys.setprofile(None)
            seen.append(calls)

    decoder.step = traced_step.__get__(decoder)
    decoder.generate(list(range(3, 40)), 24, "traversal", LookupFirst(selector, length=4), Sampling(1.0, 1.0), seed=0)
    steady = seen[1:]
    selector_steps = [s for s in steady if "export/runtime.py" in s]
    lookup_steps = [s for s in steady if "export/runtime.py" not in s]
    assert selector_steps and lookup_steps
    assert max(map(len, selector_steps)) <= WHOLE_STEP["selector"], sorted(max(selector_steps, key=len))
    assert max(map(len, lookup_steps)) <= WHOLE_STEP["lookup"], sorted(max(lookup_steps, key=len))
    assert {"engine/tree_pass.py", "engine/cache.py", "verifiers/traversal.py"} <= set.intersection(*steady)
