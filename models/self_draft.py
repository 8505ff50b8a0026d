"""Self-speculative draft: the target's first layers, a small trained adapter, and a vocabulary subset.

Terms used here:

- *shared layers*: the target's embedding and its first ``k`` decoder layers, the very same modules (on
  CPU already prepacked by `models.fast_path` with the target, so packed once). Nothing of them is saved
  in the artifact. At inference on CPU they run through `models.lean_layers` (the same computation without
  HF's module overhead, fused and packed once: about 1.3 ms less per draft forward on SmolLM2).
- *adapter*: a residual MLP on the hidden state after layer ``k``,
  ``h + W2 silu(W1 rmsnorm(h))`` (width = rows of W1), trained by distillation (models/draft_training.py).
- *vocabulary subset* S (FR-Spec style): the ``N`` token ids the draft head scores, ranked by expected
  frequency in target-generated text. The draft head is the target's final norm and the rows S of its LM
  head, plus a trained logit bias over S. Outside S the draft distribution q is exactly 0 (logit -inf),
  which keeps speculative decoding lossless: verification only needs q(x) for drafted tokens, all in S.

The module follows the HF causal-LM call convention the decoding engine uses:
``draft(input_ids=[B, n], attention_mask=None | 2D padding mask | 4D additive float mask [B|1, 1, n, ctx+n],
position_ids=[B|1, n], past_key_values=DynamicCache, use_cache=True)`` returns an object with ``.logits``
[B, n, V_full] (-inf outside S) and ``.past_key_values``. ``vocab_subset`` ([N] ids) lets a caller that
knows about subsets skip the full-width logits (`subset_logits`).

The artifact is a folder: ``config.json`` (`SelfDraftConfig`, including a fingerprint of the target) and
``adapter.safetensors`` (adapter weights, logit bias, vocabulary subset ids). Load it with
`load_self_draft(target, folder)` or through ``models.loading.load_pair(..., "self_draft:<folder>")``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn

from decoding.errors import UserInputError
from models.hf_compat import cache_kwargs
from models.lean_layers import step_inputs

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "adapter.safetensors"
FORMAT_VERSION = 1


class SelfDraftError(UserInputError):
    """A self-draft artifact that is missing, malformed, or made for another target; says what to do."""


@dataclass
class SelfDraftConfig:
    """The draft's shape. No defaults for the trained knobs: stage train_draft builds it from its config
    (``pipeline/config.py`` TrainDraftConfig, the one place defaults live); the artifact stores it."""

    layers: int  # k: target layers the draft reuses
    adapter_width: int  # hidden width of the residual MLP adapter
    vocab_subset_size: int  # N: tokens the draft head scores (FR-Spec); 0 = whole vocabulary
    hidden_size: int = 0  # filled from the target
    vocab_size: int = 0  # the target's output vocabulary (rows of its LM head)
    target_fingerprint: dict | None = None  # see `target_fingerprint`
    format_version: int = FORMAT_VERSION


def target_fingerprint(target: nn.Module) -> dict:
    """Architecture numbers and a few weight statistics identifying a target (dtype-tolerant).

    Statistics are float64 means of |w| over fixed slices, so a bf16 load of the same weights still matches
    (checked with a relative tolerance in `check_fingerprint`) while a different checkpoint does not.
    """
    cfg = target.config
    emb = target.get_input_embeddings().weight
    layers = target.model.layers
    probes = [emb[:512], emb[-512:], layers[0].self_attn.q_proj.weight, layers[-1].mlp.down_proj.weight,
              target.model.norm.weight]
    stats = [float(p.detach().double().abs().mean()) for p in probes]
    stats += [float(emb[i % emb.shape[0]].detach().double().sum()) for i in (3, 100, 1000)]
    return {
        "model_type": getattr(cfg, "model_type", None),
        "num_hidden_layers": int(cfg.num_hidden_layers),
        "hidden_size": int(cfg.hidden_size),
        "vocab_size": int(emb.shape[0]),
        "weight_stats": [round(s, 6) for s in stats],
    }


def fingerprint_difference(stored: dict, target: nn.Module) -> str | None:
    """None when ``stored`` matches ``target`` (architecture exactly, weights to 2%), else what differs."""
    now = target_fingerprint(target)
    arch = [k for k in ("model_type", "num_hidden_layers", "hidden_size", "vocab_size") if stored.get(k) != now[k]]
    a, b = torch.tensor(stored.get("weight_stats", [])), torch.tensor(now["weight_stats"])
    weights_differ = a.shape != b.shape or bool(((a - b).abs() > 0.02 * b.abs().clamp_min(1e-3)).any())
    if arch or weights_differ:
        return ", ".join(f"{k} {stored.get(k)} vs {now[k]}" for k in arch) or "weights differ"
    return None


def check_fingerprint(stored: dict | None, target: nn.Module, where: str) -> None:
    """Raise `SelfDraftError` unless ``stored`` matches ``target`` (see `fingerprint_difference`)."""
    if stored is None:
        raise SelfDraftError(f"{where}: the artifact has no target fingerprint; retrain it (branchpoint train-draft)")
    what = fingerprint_difference(stored, target)
    if what is not None:
        raise SelfDraftError(
            f"{where} was trained for a different target ({what}); retrain it for this target with "
            "`branchpoint train-draft` (or `dvc repro train_draft`)"
        )


class ResidualAdapter(nn.Module):
    """``h + W2 silu(W1 rmsnorm(h))``; W2 starts at zero so the untrained adapter is the identity."""

    def __init__(self, hidden: int, width: int, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=eps)
        self.up = nn.Linear(hidden, width)
        self.down = nn.Linear(width, hidden)
        nn.init.zeros_(self.down.weight)
        nn.init.zeros_(self.down.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., H]
        return h + self.down(nn.functional.silu(self.up(self.norm(h))))


def _call_options(past_key_values, options: dict) -> tuple:
    """``(cache, use_cache, output_hidden_states)`` of a forward call's keywords: the cache under either name."""
    cache = options.get("cache")
    return (cache if cache is not None else past_key_values, bool(options.get("use_cache", True)),
            bool(options.get("output_hidden_states", False)))


def _keep_positions(h: torch.Tensor, logits_to_keep) -> torch.Tensor:
    """``h`` [B, n, H] at the positions HF's ``logits_to_keep`` names (0 = all, int k = the last k, 1D tensor = those)."""
    if isinstance(logits_to_keep, torch.Tensor):
        return h[:, logits_to_keep.to(h.device)]
    return h[:, -logits_to_keep:] if logits_to_keep else h


class _Output:
    """The call convention's return value: ``.logits``, ``.past_key_values`` (alias ``.cache``), ``.hidden_states``."""

    def __init__(self, logits: torch.Tensor, cache, hidden_states=None):
        self.logits = logits
        self.past_key_values = cache
        self.cache = cache
        self.hidden_states = hidden_states


class SelfDraft(nn.Module):
    """The draft LM (see the module docstring). Trainable parts: ``adapter`` and ``logit_bias``."""

    def __init__(self, target: nn.Module, config: SelfDraftConfig, vocab_subset: torch.Tensor | None = None):
        super().__init__()
        n_layers = target.config.num_hidden_layers
        if not 1 <= config.layers <= n_layers:
            raise SelfDraftError(f"draft layers k={config.layers} must be between 1 and the target's {n_layers}")
        head = target.get_output_embeddings().weight  # [V, H]
        config.hidden_size, config.vocab_size = int(head.shape[1]), int(head.shape[0])
        if vocab_subset is None:
            vocab_subset = torch.arange(min(config.vocab_subset_size or config.vocab_size, config.vocab_size))
        vocab_subset = vocab_subset.to(torch.long).cpu()
        if vocab_subset.numel() == 0 or int(vocab_subset.max()) >= config.vocab_size or int(vocab_subset.min()) < 0:
            raise SelfDraftError(f"vocabulary subset must hold ids in [0, {config.vocab_size})")
        self.config_draft = config
        self.k = config.layers
        body = target.model
        self.embed_tokens = body.embed_tokens  # shared, frozen
        self.layers = nn.ModuleList(body.layers[: self.k])  # shared, frozen
        self.rotary_emb = body.rotary_emb
        self.final_norm = body.norm
        self.adapter = ResidualAdapter(config.hidden_size, config.adapter_width).to(head.device, head.dtype)
        self.register_buffer("vocab_subset", vocab_subset.to(head.device))  # [N]
        self.head = nn.Linear(config.hidden_size, vocab_subset.numel(), bias=True).to(head.device, head.dtype)
        with torch.no_grad():
            self.head.weight.copy_(head.detach()[self.vocab_subset])  # [N, H] copy of the target's rows
            self.head.bias.zero_()  # the trained logit bias over S
        self.head.weight.requires_grad_(False)
        self.config = copy.deepcopy(target.config)  # HF-style config: DynamicCache(config=draft.config) works
        self.config.num_hidden_layers = self.k
        self._target_head = target.get_output_embeddings()
        for p in list(self.embed_tokens.parameters()) + list(self.layers.parameters()):
            p.requires_grad_(False)
        self.lean = True  # run the shared layers through models/lean_layers.py where it applies
        self._lean = None  # its fused, packed weights (built lazily)

    # --- HF-style accessors used by models.loading and the engine ---------------------------------------
    def get_output_embeddings(self) -> nn.Module:
        """The target's full LM head: the vocabulary the draft's logits are indexed by."""
        return self._target_head

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.head.weight.dtype

    # --- forward ------------------------------------------------------------------------------------------
    def hidden_after_layers(self, input_ids, attention_mask=None, position_ids=None, cache=None,
                            use_cache=True) -> torch.Tensor:
        """Hidden states after the k shared layers: [B, n, H]; updates ``cache`` for those layers."""
        h = self.embed_tokens(input_ids)  # [B, n, H]
        position_ids, pos_emb, mask = step_inputs(h, self.rotary_emb, attention_mask, position_ids, cache)
        lean = self._lean_layers(h)
        if lean is not None:
            return lean(h, pos_emb, mask, cache if use_cache else None)
        for layer in self.layers:  # the cache under the keyword this transformers' layers read (5.17 vs 5.25)
            h = layer(h, attention_mask=mask, position_ids=position_ids, use_cache=use_cache,
                      position_embeddings=pos_emb, **cache_kwargs(layer, cache))
        return h

    def _lean_layers(self, h: torch.Tensor):
        """The shared layers' lean path (`models.lean_layers`) when it applies to this call, else None.
        Built on the first inference call (after `prepare_for_inference`); ``self.lean = False`` turns it off.
        Never while autograd records (training runs the HF layers): checked here, the one place, before building."""
        if not self.lean or torch.is_grad_enabled():
            return None
        if self._lean is None:
            from models.lean_layers import LeanLayers

            self._lean = LeanLayers(self.layers)
        return self._lean if self._lean.applies(h) else None

    def head_logits(self, h: torch.Tensor, return_hidden: bool = False, logits_to_keep=0):
        """Subset logits [..., N] from hidden states after layer k [..., H] (and the normed hidden state, at every
        position); with ``logits_to_keep`` (``h`` [B, n, H]; see `forward`) the logits of those positions only.
        (On a target split over GPUs the shared layers and the adapter/head may sit on different devices:
        the hidden states follow the adapter; a no-op on one device.)"""
        h = self.final_norm(self.adapter(h.to(self.device)))  # [..., H]
        z = self.head(_keep_positions(h, logits_to_keep).to(self.device))
        return (z, h) if return_hidden else z

    def subset_logits(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                      logits_to_keep=0, **options):
        """Like `forward` but returns ``(logits over S [B, n', N], cache)`` (+ hidden states of all n positions
        when asked); ``logits_to_keep`` and ``options`` as in `forward`."""
        cache, use_cache, output_hidden_states = _call_options(past_key_values, options)
        if use_cache and cache is None:
            from transformers import DynamicCache

            cache = DynamicCache()
        h = self.hidden_after_layers(input_ids, attention_mask, position_ids, cache, use_cache)
        z, last = self.head_logits(h, return_hidden=True, logits_to_keep=logits_to_keep)  # [B, n', N], [B, n, H]
        return (z, cache, (h, last)) if output_hidden_states else (z, cache)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, logits_to_keep=0,
                **options) -> _Output:
        """HF call convention. ``logits_to_keep`` (HF's): 0 = logits at every position, an int k > 0 = at the last
        k, a 1D tensor = at those positions (the head, the costly part, runs on those rows only). ``options``:
        ``use_cache`` (default True), ``cache`` (the KV cache under transformers' newer name; either name works),
        ``output_hidden_states`` (``.hidden_states`` is then (after layer k, final), of every position); other HF
        keywords are ignored."""
        z, cache, *hidden = self.subset_logits(input_ids, attention_mask, position_ids, past_key_values,
                                               logits_to_keep, **options)
        logits = z.new_full((*z.shape[:-1], self.config_draft.vocab_size), float("-inf"))  # [B, n, V]
        logits[..., self.vocab_subset] = z
        return _Output(logits, cache, hidden[0] if hidden else None)

    # --- artifact -----------------------------------------------------------------------------------------
    def trained_state(self) -> dict[str, torch.Tensor]:
        """What the artifact stores: adapter weights, logit bias, subset ids (not the shared weights)."""
        state = {f"adapter.{k}": v.detach().cpu().contiguous() for k, v in self.adapter.state_dict().items()}
        state["logit_bias"] = self.head.bias.detach().cpu().contiguous()
        state["vocab_subset"] = self.vocab_subset.cpu().contiguous()
        return state


def save_self_draft(draft: SelfDraft, folder: str | Path, extra: dict | None = None) -> Path:
    """Write the artifact to a temp folder next to ``folder``, then rename it into place."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp", dir=folder.parent))
    try:
        save_file(draft.trained_state(), str(tmp / WEIGHTS_FILE))
        meta = asdict(draft.config_draft) | {"extra": extra or {}}
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        for path in (tmp, tmp / WEIGHTS_FILE, tmp / CONFIG_FILE):  # mkdtemp makes private (0700) files
            path.chmod(0o755 if path.is_dir() else 0o644)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def read_raw_config(folder: str | Path, version: int = FORMAT_VERSION) -> dict:
    """A trained draft artifact's ``config.json`` (either kind), checked to exist with its weights and the format
    ``version``."""
    folder = Path(folder)
    if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise SelfDraftError(
            f"no draft artifact at {folder}/ (needs {CONFIG_FILE} and {WEIGHTS_FILE}); build it with "
            "`dvc repro train_draft` or `branchpoint train-draft`"
        )
    try:
        raw = json.loads((folder / CONFIG_FILE).read_text())
    except json.JSONDecodeError as e:
        raise SelfDraftError(f"{folder / CONFIG_FILE} is not valid JSON ({e}); retrain the draft") from None
    if raw.get("format_version") != version:
        raise SelfDraftError(f"{folder}: artifact format {raw.get('format_version')} != {version}; retrain it")
    return raw


def read_artifact_config(folder: str | Path) -> SelfDraftConfig:
    raw = read_raw_config(folder)
    if raw.get("kind", "self_draft") != "self_draft":
        raise SelfDraftError(f"{folder} holds a {raw['kind']} draft, not a self-draft; load it as "
                             f"{raw['kind']}:{folder}")
    known = {f.name for f in fields(SelfDraftConfig)}
    return SelfDraftConfig(**{k: v for k, v in raw.items() if k in known})


def load_self_draft(target: nn.Module, folder: str | Path) -> SelfDraft:
    """The draft stored in ``folder`` on top of ``target`` (fingerprint-checked), in eval mode and on
    its device's fastest exact path (`models.fast_path.prepare_for_inference`; shared layers packed once)."""
    from safetensors.torch import load_file

    from models.fast_path import prepare_for_inference

    folder = Path(folder)
    config = read_artifact_config(folder)
    check_fingerprint(config.target_fingerprint, target, f"self-draft artifact {folder}")
    state = load_file(str(folder / WEIGHTS_FILE))
    draft = SelfDraft(target, config, vocab_subset=state["vocab_subset"])
    adapter = {k.removeprefix("adapter."): v for k, v in state.items() if k.startswith("adapter.")}
    try:
        draft.adapter.load_state_dict(adapter)
    except RuntimeError as e:
        raise SelfDraftError(f"{folder}: adapter weights do not match its config: {e}") from None
    with torch.no_grad():
        draft.head.bias.copy_(state["logit_bias"])
    return prepare_for_inference(draft.eval())
