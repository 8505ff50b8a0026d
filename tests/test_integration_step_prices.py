"""integrations/step_prices.py: transformers' own step prices, measured in its loop and priced with."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import VOCAB, untied_pair
from selector_helpers import toy_latency
from test_integration_transformers import PROMPT, export_chain

from decoding import pricing
from decoding.actions import Action
from integrations.step_prices import fit, measure, step_seconds, with_prices
from integrations.transformers import BranchpointDecoding, load_chain_selector


def test_step_seconds_leave_out_the_prefill_step():
    trace = [(10.0, "plain", 0), (10.5, "draft", 2), (10.7, "draft", 2), (11.0, "draft", 1)]
    assert step_seconds(trace, 11.4) == pytest.approx([0.2, 0.3, 0.4])


def test_fit_recovers_a_line_and_refuses_one_length():
    ratios = {"1": [1.29, 1.31], "2": [1.41, 1.39], "4": [1.60]}
    line = fit(ratios)
    assert line["step"] == pytest.approx(1.2, abs=1e-6) and line["node"] == pytest.approx(0.1, abs=1e-6)
    assert line["residual"] < 0.02
    assert fit({"1": [0.9], "2": [0.8]})["node"] == 0.0  # non-negative: a cheaper longer chain is noise
    with pytest.raises(ValueError, match="two draft lengths"):
        fit({"3": [1.2, 1.3]})


def test_the_priced_profile_prices_chains_on_the_measured_line():
    latency = with_prices(toy_latency(), {"step": 1.25, "node": 0.07, "residual": 0.0}, {"ratios": {"1": [1.3]}})
    chains = [Action(1, n, 0) for n in range(5)]
    ratio = pricing.step_ratio(latency, [100, 300], chains)
    assert ratio == pytest.approx(np.array([[1.0, 1.32, 1.39, 1.46, 1.53]] * 2))
    assert latency.meta["step_ratios_transformers"]["ratios"] == {"1": [1.3]}
    assert latency.t_p(100, 1) == toy_latency().t_p(100, 1)  # the forward tables (the features) are kept


def test_a_selector_priced_with_dear_steps_declines_in_generate(tmp_path):
    """The same chain selector drafts under the engine's toy prices and takes plain steps when generate()'s
    drafted step is priced at 3 + n plain steps: the decision follows the profile it is given."""
    target, draft = untied_pair(seed=3, noise=0.3)
    folder = export_chain(tmp_path / "selector_chain", target.config.hidden_size, VOCAB)
    dear = with_prices(toy_latency(), {"step": 3.0, "node": 1.0, "residual": 0.0}).save(tmp_path / "dear.json")
    ids = torch.tensor(PROMPT)
    kw = {"do_sample": False, "max_new_tokens": 24, "min_new_tokens": 24}
    steps = {}
    for name, latency in (("engine", None), ("dear", dear)):
        decoding = BranchpointDecoding(load_chain_selector(folder, target, latency), draft)
        target.generate(ids, custom_generate=decoding, **kw)
        steps[name] = decoding.last_generator.steps
    assert steps["engine"]["draft"] > 0 and steps["dear"]["draft"] == 0 and steps["dear"]["plain"] == 24


def test_measure_times_every_length_between_plain_decodes():
    target, draft = untied_pair(seed=3, noise=0.3)
    lines = []
    out = measure(target, draft, [PROMPT[0], PROMPT[0][:6]], lengths=(1, 3), tokens=8, progress=lines.append)
    assert set(out["ratios"]) == {"1", "3"} and all(len(r) == 2 for r in out["ratios"].values())
    assert all(np.isfinite(r) and r > 0 for rs in out["ratios"].values() for r in rs)
    assert len(out["plain_step_seconds"]) == 2 * 3  # a plain decode before and after each length, per prompt
    assert len(lines) == 2 and "n=3" in lines[-1]
    with pytest.raises(ValueError, match="lengths >= 1"):
        measure(target, draft, [PROMPT[0]], lengths=(0,))
