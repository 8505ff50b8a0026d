"""Prompt sets: built-in sets, local files, errors, chat formatting and the by-prompt split."""

import json
from importlib.resources import files

import datasets
import huggingface_hub
import pandas as pd
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from data_collection.prompts import (
    BUILTIN_SETS,
    KNOWN_SETS,
    PromptSetError,
    format_prompts,
    load_prompt_set,
    split_prompts,
)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """Offline even when the env vars were not set before `datasets` was imported (no retries)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def _tiny_tokenizer(chat_template=None):
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tok.chat_template = chat_template
    return tok


def _prompts(n, start=0):
    ids = [f"p/{i}" for i in range(start, start + n)]
    return datasets.Dataset.from_dict({"prompt_id": ids, "source": ["p"] * n, "text": [f"t{i}" for i in ids]})


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------- built-in sets


def test_humaneval_has_164_unique_prompts():
    ds = load_prompt_set("humaneval")
    assert ds.column_names == ["prompt_id", "source", "text"]
    assert len(ds) == 164 and len(set(ds["prompt_id"])) == 164 and len(set(ds["text"])) == 164
    assert ds[0]["prompt_id"] == "HumanEval/0" and set(ds["source"]) == {"humaneval"}
    assert all("def " in t for t in ds["text"])


@pytest.mark.parametrize("name", BUILTIN_SETS)
def test_builtin_sets_have_40_distinct_nonempty_prompts(name):
    ds = load_prompt_set(name)
    assert len(ds) >= 40
    assert len(set(ds["text"])) == len(ds) and len(set(ds["prompt_id"])) == len(ds)
    assert all(t.strip() == t and len(t) > 20 for t in ds["text"])
    assert all(pid.startswith(f"{name}/") for pid in ds["prompt_id"]) and set(ds["source"]) == {name}


def test_translation_covers_both_directions_of_each_pair():
    texts = load_prompt_set("translation")["text"]
    for lang in ("French", "Spanish", "Italian"):
        assert sum(f"to {lang}" in t or f"into {lang}" in t or f"in {lang}?" in t for t in texts) >= 5
        assert (
            sum(f"from {lang}" in t or f"{lang} to English" in t or f"this {lang}" in t for t in texts) >= 5
        )


def test_default_mixture_and_max_prompts_per_source():
    full = load_prompt_set("default")
    parts = ["humaneval", "writing", "math", "translation"]
    assert len(full) == sum(len(load_prompt_set(p)) for p in parts)
    capped = load_prompt_set("default", max_prompts=5)
    assert capped["source"] == [p for p in parts for _ in range(5)]
    assert capped["prompt_id"][:5] == full["prompt_id"][:5]
    writing_file = str(files("data_collection") / "prompt_sets" / "writing.jsonl")
    mixed = load_prompt_set(["math", {"path": writing_file, "max_prompts": 2}], max_prompts=4)
    assert mixed["source"] == ["math"] * 4 + ["writing"] * 2


# ---------------------------------------------------------------- local files and hub specs


def test_local_jsonl_csv_parquet_with_custom_columns(tmp_path):
    rows = [{"qid": f"q{i}", "question": f"What is {i} + {i}?", "other": i} for i in range(6)]
    _write_jsonl(tmp_path / "qs.jsonl", rows)
    pd.DataFrame(rows).to_csv(tmp_path / "qs.csv", index=False)
    pd.DataFrame(rows).to_parquet(tmp_path / "qs.parquet")
    for suffix in ("jsonl", "csv", "parquet"):
        ds = load_prompt_set(
            {"path": str(tmp_path / f"qs.{suffix}"), "text_column": "question", "id_column": "qid"}
        )
        assert ds["text"] == [r["question"] for r in rows]
        assert ds["prompt_id"] == [f"qs/q{i}" for i in range(6)] and set(ds["source"]) == {"qs"}
    named = load_prompt_set({"path": str(tmp_path / "qs.csv"), "text_column": "question", "name": "arith"})
    assert named["prompt_id"][0] == "arith/0" and named["source"][0] == "arith"
    both = load_prompt_set(
        [{"path": str(tmp_path / "qs.csv"), "text_column": "question"}, "math"], max_prompts=3
    )
    assert both["source"] == ["qs"] * 3 + ["math"] * 3


def test_local_json_array_and_blank_rows_dropped(tmp_path):
    path = tmp_path / "arr.json"
    path.write_text(json.dumps([{"text": "Hello there"}, {"text": "   "}, {"text": None}, {"text": "Bye"}]))
    assert load_prompt_set({"path": str(path)})["text"] == ["Hello there", "Bye"]


def test_hub_spec_maps_columns_from_a_local_dataset_dir(tmp_path):
    _write_jsonl(tmp_path / "train.jsonl", [{"question": "Why?", "n": 1}, {"question": "How?", "n": 2}])
    ds = load_prompt_set({"hf": str(tmp_path), "split": "train", "text_column": "question", "name": "local"})
    assert ds["text"] == ["Why?", "How?"] and ds["prompt_id"] == ["local/0", "local/1"]


def test_uncached_hub_dataset_offline_is_one_clear_error():
    spec = {"hf": "openai/gsm8k", "config": "main", "split": "test", "text_column": "question"}
    with pytest.raises(PromptSetError) as err:
        load_prompt_set(spec)
    msg = str(err.value)
    assert (
        "openai/gsm8k" in msg and "not in the local HF cache" in msg and "offline" in msg and "\n" not in msg
    )


# ---------------------------------------------------------------- errors


def test_unknown_set_lists_known_names():
    with pytest.raises(PromptSetError, match="unknown prompt set 'nope'") as err:
        load_prompt_set("nope")
    assert all(name in str(err.value) for name in KNOWN_SETS)
    assert isinstance(err.value, ValueError)


def test_missing_file(tmp_path):
    with pytest.raises(PromptSetError, match="not found"):
        load_prompt_set({"path": str(tmp_path / "absent.jsonl")})


def test_missing_text_column_lists_columns(tmp_path):
    path = _write_jsonl(tmp_path / "q.jsonl", [{"question": "a", "answer": "b"}])
    with pytest.raises(PromptSetError, match="no column 'text'; columns present: question, answer"):
        load_prompt_set({"path": str(path)})
    with pytest.raises(PromptSetError, match="no column 'qid'"):
        load_prompt_set({"path": str(path), "text_column": "question", "id_column": "qid"})


@pytest.mark.parametrize("content", ["", '{"text": " "}\n{"text": ""}\n'])
def test_empty_prompt_set(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(PromptSetError, match="'empty' is empty"):
        load_prompt_set({"path": str(path)})


def test_duplicate_ids(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"id": "x", "text": "a"}, {"id": "x", "text": "b"}])
    with pytest.raises(PromptSetError, match="duplicate prompt id 'd/x'"):
        load_prompt_set({"path": str(path), "id_column": "id"})
    with pytest.raises(PromptSetError, match="duplicate prompt id 'math/000'"):
        load_prompt_set(["math", "math"])


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"question": "x"}, "needs a 'path' or an 'hf' key"),
        ({"path": "x.txt"}, "cannot tell the format"),
        ({"path": "x.jsonl", "txt_column": "q"}, "unknown keys \\['txt_column'\\]"),
        ([], "empty prompt spec list"),
        (3, "must be a set name, a dict or a list"),
    ],
)
def test_bad_specs(spec, match):
    with pytest.raises(PromptSetError, match=match):
        load_prompt_set(spec)


def test_non_text_column_and_bad_max_prompts(tmp_path):
    path = _write_jsonl(tmp_path / "n.jsonl", [{"text": 1}, {"text": 2}])
    with pytest.raises(PromptSetError, match="holds int64, not strings"):
        load_prompt_set({"path": str(path)})
    with pytest.raises(PromptSetError, match="max_prompts"):
        load_prompt_set("math", max_prompts=0)


# ---------------------------------------------------------------- chat template


def test_chat_template_applied():
    ds = load_prompt_set("math", max_prompts=2)
    out = format_prompts(ds, _tiny_tokenizer(CHAT_TEMPLATE))
    assert out["formatted"][0] == f"<|user|>{ds['text'][0]}<|end|><|assistant|>"
    sys_out = format_prompts(out, _tiny_tokenizer(CHAT_TEMPLATE), system_prompt="Be brief.")
    assert sys_out["formatted"][1] == f"<|system|>Be brief.<|end|><|user|>{ds['text'][1]}<|end|><|assistant|>"
    assert sys_out.column_names == ["prompt_id", "source", "text", "formatted"]


def test_raw_text_without_template_or_when_disabled():
    ds = load_prompt_set("writing", max_prompts=3)
    assert format_prompts(ds, _tiny_tokenizer())["formatted"] == ds["text"]
    assert (
        format_prompts(ds, _tiny_tokenizer(CHAT_TEMPLATE), use_chat_template=False)["formatted"] == ds["text"]
    )
    assert format_prompts(ds, _tiny_tokenizer(), system_prompt="S")["formatted"][0] == "S\n\n" + ds["text"][0]


# ---------------------------------------------------------------- split by prompt


def _ids(splits):
    return {name: list(part["prompt_id"]) for name, part in splits.items()}


def test_split_is_deterministic_disjoint_and_covering():
    ds = load_prompt_set("default")
    first, again = _ids(split_prompts(ds, seed=3)), _ids(split_prompts(ds, seed=3))
    assert first == again and list(first) == ["draft", "train", "val", "test"]
    all_ids = [pid for part in first.values() for pid in part]
    assert sorted(all_ids) == sorted(ds["prompt_id"]) and len(set(all_ids)) == len(all_ids)
    assert 0.5 < len(first["draft"]) / len(ds) < 0.7 and 0.12 < len(first["train"]) / len(ds) < 0.28
    assert _ids(split_prompts(ds, seed=4)) != first


def test_split_of_a_prompt_is_stable_when_prompts_are_added():
    small, big = _ids(split_prompts(_prompts(200))), _ids(split_prompts(_prompts(260)))
    for name in small:
        assert set(small[name]) <= set(big[name])


def test_small_sets_get_every_split_non_empty():
    for n in (4, 10, 11):
        for seed in range(20):
            splits = split_prompts(_prompts(n), seed=seed)
            assert all(len(part) >= 1 for part in splits.values()) and sum(map(len, splits.values())) == n
    one = split_prompts(_prompts(1))
    assert sum(map(len, one.values())) == 1


def test_split_rejects_bad_fractions():
    with pytest.raises(PromptSetError, match="fractions"):
        split_prompts(_prompts(5), fractions=(0.5, 0.2, 0.2, 0.2))
    with pytest.raises(PromptSetError, match=r"4 non-negative numbers \[draft, train, val, test\]"):
        split_prompts(_prompts(5), fractions=(0.8, 0.1, 0.1))


def test_split_is_by_prompt_and_a_zero_fraction_stays_empty():
    """The part of a prompt depends on its id alone (u = hash(seed, id) against the cumulative fractions)."""
    from data_collection.prompts import unit_hash

    ds = _prompts(200)
    splits = split_prompts(ds, fractions=(0.6, 0.2, 0.1, 0.1), seed=5)
    bounds = [0.0, 0.6, 0.8, 0.9, 1.0]
    for k, name in enumerate(("draft", "train", "val", "test")):
        assert all(bounds[k] <= unit_hash(5, pid) < bounds[k + 1] for pid in splits[name]["prompt_id"])
    no_val = split_prompts(ds, fractions=(0.7, 0.2, 0.0, 0.1), seed=5)
    assert len(no_val["val"]) == 0 and sum(map(len, no_val.values())) == len(ds)
