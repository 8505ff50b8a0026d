"""Stage trajectories on the tiny random pair: the sampler, the Parquet + manifest data layer, the stage."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import TINY_VOCAB, tiny_lm

from data_collection.trajectory_store import (
    Trajectory,
    TrajectoryError,
    load_trajectories,
    read_trajectory_manifest,
    save_trajectories,
)
from decoding.sampling import Sampling
from models.sampler import Row, sample_continuations

EOS = [2]


@pytest.fixture(scope="module")
def model():
    return tiny_lm(2, seed=3, hidden=32)


def prompts(n=5):
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, TINY_VOCAB, (3 + 2 * i,), generator=gen).tolist() for i in range(n)]


def greedy_reference(model, prompt, n):
    """Argmax continuation from full forwards without a cache (the slow, obvious way)."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_sampling_is_seeded_per_row_and_independent_of_batching(model, one_thread):
    rows = [Row(p, Sampling(1.0), seed=10 + i) for i, p in enumerate(prompts())]
    one = sample_continuations(model, rows, 6, eos=[], batch_size=5)
    assert sample_continuations(model, rows, 6, eos=[], batch_size=5) == one
    assert sample_continuations(model, rows, 6, eos=[], batch_size=2) == one  # other batch mates
    assert sample_continuations(model, rows[::-1], 6, eos=[], batch_size=3) == one[::-1]
    reseeded = [Row(r.prompt, r.sampling, r.seed + 100) for r in rows]
    assert sample_continuations(model, reseeded, 6, eos=[], batch_size=5) != one
    assert all(len(c) == 6 for c in one)


def test_temperature_zero_is_greedy_and_tiny_top_p_too(model, one_thread):
    ps = prompts(3)
    want = [greedy_reference(model, p, 5) for p in ps]
    for sampling in (Sampling(0.0), Sampling(1.0, top_p=1e-6)):  # no division by zero at T = 0
        rows = [Row(p, sampling, seed=i) for i, p in enumerate(ps)]
        assert sample_continuations(model, rows, 5, eos=[], batch_size=2) == want


def test_mixed_settings_and_eos(model, one_thread):
    p = prompts(1)[0]
    greedy = greedy_reference(model, p, 4)
    rows = [Row(p, Sampling(0.0), 0), Row(p, Sampling(0.6, 0.9), 1), Row(p, Sampling(0.0), 2)]
    eos = greedy[1]
    out = sample_continuations(model, rows, 4, eos=[eos], batch_size=8)
    assert out[0] == out[2] == greedy[: greedy.index(eos) + 1]  # EOS kept, sampling stopped there
    assert eos not in out[1][:-1] and len(out[1]) <= 4


def test_progress_bar_counts_sampled_tokens_and_changes_nothing(model, capsys, one_thread):
    rows = [Row(p, Sampling(1.0), i) for i, p in enumerate(prompts(3))]
    quiet = sample_continuations(model, rows, 6, eos=EOS, batch_size=2)
    shown = sample_continuations(model, rows, 6, eos=EOS, batch_size=2, progress="sampling")
    assert shown == quiet
    total = sum(map(len, shown))
    assert f"{total}/{total}" in capsys.readouterr().err.replace(" ", "").split("sampling")[-1]


# ---------------------------------------------------------------- data layer


def trajectories():
    return [
        Trajectory("a/1", "a", "draft", 1.0, 1.0, 0, [5, 6, 7], [8, 9, 2]),
        Trajectory("a/2", "a", "train", 0.6, 1.0, 0, [5], [10]),
        Trajectory("b/1", "b", "test", 0.0, 0.9, 1, [4, 4], []),
    ]


def test_save_load_round_trip_and_split_filter(tmp_path):
    folder = save_trajectories(tmp_path / "t", trajectories(), {"target": "tiny"})
    assert load_trajectories(folder) == trajectories()
    assert load_trajectories(folder / "trajectories.parquet", splits=["test"]) == trajectories()[2:]
    manifest = read_trajectory_manifest(folder)
    assert manifest["target"] == "tiny" and manifest["rows"] == 3
    assert manifest["counts"]["draft"] == {"trajectories": 1, "tokens": 3, "settings": {"T=1,top_p=1": 1}}
    assert not [p for p in folder.iterdir() if "tmp" in p.name]
    import datasets

    ds = datasets.load_dataset("parquet", data_files=str(folder / "trajectories.parquet"), split="train")
    assert ds["continuation_ids"] == [[8, 9, 2], [10], []] and ds["split"] == ["draft", "train", "test"]


def test_digest_is_the_tokens_not_the_bookkeeping(tmp_path):
    """Collect keys its dataset on `trajectories_digest`: the same tokens sampled again (other speed, other batch size)
    keep it; other tokens change it."""
    from pipeline.collect import trajectories_digest

    a = save_trajectories(tmp_path / "a", trajectories(), {"target": "tiny", "sampling_seconds": 1.0})
    b = save_trajectories(tmp_path / "b", trajectories(), {"target": "tiny", "sampling_seconds": 9.0})
    assert trajectories_digest(a) == trajectories_digest(b)
    other = trajectories()[:2]
    assert trajectories_digest(save_trajectories(tmp_path / "c", other, {"target": "tiny"})) != trajectories_digest(a)
    with pytest.raises(TrajectoryError, match="no trajectories at"):
        trajectories_digest(tmp_path / "missing")


def test_corrupt_or_missing_files_give_one_clear_error(tmp_path):
    with pytest.raises(TrajectoryError, match="no trajectories at .*branchpoint trajectories"):
        load_trajectories(tmp_path / "missing")
    folder = save_trajectories(tmp_path / "t", trajectories(), {})
    parquet = folder / "trajectories.parquet"
    data = bytearray(parquet.read_bytes())
    data[len(data) // 2] ^= 0xFF
    parquet.write_bytes(bytes(data))
    with pytest.raises(TrajectoryError, match="sha256"):
        load_trajectories(folder)
    save_trajectories(folder, trajectories(), {})
    (folder / "manifest.json").write_text('{"format_version": 1, "sha2')
    with pytest.raises(TrajectoryError, match="not valid JSON"):
        load_trajectories(folder)
    save_trajectories(folder, trajectories(), {})
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "rows": 4}))
    with pytest.raises(TrajectoryError, match="3 rows, manifest says 4"):
        load_trajectories(folder)
    with pytest.raises(ValueError, match="unknown splits"):
        save_trajectories(folder, [Trajectory("x", "x", "holdout", 1.0, 1.0, 0, [1], [2])], {})


# ---------------------------------------------------------------- the stage


@pytest.fixture
def stage_args(tmp_path):
    from tiny_models import save_tiny_model

    target = save_tiny_model(tmp_path / "target", 2, seed=0)
    lines = [json.dumps({"id": str(i), "text": " ".join(f"w{3 + (i * 7 + j) % 60}" for j in range(2 + i % 5))})
             for i in range(24)]
    (tmp_path / "p.jsonl").write_text("\n".join(lines) + "\n")
    overrides = {"model.target": f"hf:{target}", "model.device": "cpu",
                 "prompts.sets": json.dumps([{"path": str(tmp_path / "p.jsonl")}]),
                 "trajectories.max_new_tokens": 5, "trajectories.batch_size": 4, "trajectories.threads": 1}
    return [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]


def run_stage(args, out, *extra):
    from pipeline.cli import main

    assert main(["trajectories", "--no-progress", *args, "--set", f"trajectories.out={out}", *extra]) == 0
    return load_trajectories(out)


def test_stage_splits_settings_and_seeded_reproduction(stage_args, tmp_path):
    from data_collection.prompts import encode_prompt
    from models.loading import load_tokenizer

    one = ("--set", "trajectories.all_settings=false",  # one setting per prompt (the default is every setting)
           "--set", "trajectories.draft_samples_per_prompt=1")
    first = run_stage(stage_args, tmp_path / "a", *one)
    assert run_stage(stage_args, tmp_path / "b", *one, "--set", "trajectories.batch_size=7") == first
    by_split = {s: [t for t in first if t.split == s] for s in ("draft", "train", "val", "test")}
    assert all(by_split.values()) and len(first) == 24  # one setting per prompt
    assert {t.setting for t in by_split["draft"]} == {(1.0, 1.0)}
    grid = {t.setting for s in ("train", "val", "test") for t in by_split[s]}
    assert grid <= {(1.0, 1.0), (0.6, 1.0)} and len(grid) == 2  # the hash spreads prompts over the grid
    assert all(1 <= len(t.continuation_ids) <= 5 for t in first)
    tok = load_tokenizer(stage_args[stage_args.index("--set") + 1].split("=", 1)[1])
    text = " ".join(f"w{3 + j % 60}" for j in range(2))  # prompt id "0"
    assert next(t for t in first if t.prompt_id == "p/0").prompt_ids == encode_prompt(text, tok)
    manifest = read_trajectory_manifest(tmp_path / "a")
    assert sum(c["trajectories"] for c in manifest["counts"].values()) == 24
    assert manifest["config"]["trajectories"]["max_new_tokens"] == 5 and manifest["target_fingerprint"]


def test_stage_all_settings_and_greedy(stage_args, tmp_path):
    out = run_stage(stage_args, tmp_path / "c", "--set", "trajectories.all_settings=true",
                    "--set", "trajectories.temperatures=[0.0, 1.0]", "--set", "trajectories.top_ps=[1.0, 0.5]")
    for pid in {t.prompt_id for t in out if t.split != "draft"}:
        assert {t.setting for t in out if t.prompt_id == pid} == {(0.0, 1.0), (0.0, 0.5), (1.0, 1.0), (1.0, 0.5)}
    greedy = {t.prompt_id: t.continuation_ids for t in out if t.setting == (0.0, 1.0)}
    assert greedy == {t.prompt_id: t.continuation_ids for t in out if t.setting == (0.0, 0.5)}


def test_draft_prompts_get_their_own_sample_count(stage_args, tmp_path):
    """``draft_samples_per_prompt`` adds distillation trajectories of the draft prompts only: distinct seeded
    samples, and the train/val/test trajectories are the very same as with one draft sample."""
    base = ("--set", "trajectories.all_settings=false")
    one = run_stage(stage_args, tmp_path / "one", *base, "--set", "trajectories.draft_samples_per_prompt=1")
    three = run_stage(stage_args, tmp_path / "three", *base, "--set", "trajectories.draft_samples_per_prompt=3")
    draft_one = [t for t in one if t.split == "draft"]
    draft_three = [t for t in three if t.split == "draft"]
    assert len(draft_three) == 3 * len(draft_one) > 0
    for pid in {t.prompt_id for t in draft_one}:
        samples = [t for t in draft_three if t.prompt_id == pid]
        assert sorted(t.sample for t in samples) == [0, 1, 2]
    distinct = {(t.prompt_id, tuple(t.continuation_ids)) for t in draft_three}  # own seeds: new continuations
    assert len(distinct) > 2 * len(draft_one)
    assert [t for t in three if t.split != "draft"] == [t for t in one if t.split != "draft"]
    assert [t for t in draft_three if t.sample == 0] == draft_one
