"""The project's self-speculative draft as an HF assistant model (``generate(assistant_model=...)`` takes it).

`models.self_draft.SelfDraft` is a plain ``nn.Module`` with the HF causal-LM call convention; transformers'
assisted generation also needs a ``PreTrainedModel`` with ``generate()``, a ``generation_config`` and a config.
`SelfDraftAssistant` is that shell around it: the target's config (k layers), no weights of its own (the draft's
modules are the target's own layers plus the trained adapter and head), its forward the draft's. So transformers'
own assisted generation, prompt lookup aside, and `integrations.transformers.branchpoint_generate` decode with
the same draft on the same weights.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

# the output's cache field: ``cache`` in transformers >= 5.25 (``past_key_values`` there is a deprecated alias)
_CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


class SelfDraftAssistant(PreTrainedModel, GenerationMixin):
    """A `SelfDraft` as an HF causal LM for ``generate(assistant_model=...)`` (see the module docstring)."""

    base_model_prefix = "draft"
    _supports_sdpa = True  # attention runs in the target's own layers, with the target's implementation
    _supports_flash_attn = True
    _supports_attention_backend = True

    def __init__(self, draft, target) -> None:
        config = copy.deepcopy(draft.config)
        super().__init__(config)
        self.draft = draft
        self.generation_config = GenerationConfig.from_model_config(config)
        if target.generation_config is not None:  # the target's EOS and special tokens, transformers' defaults else
            self.generation_config = copy.deepcopy(target.generation_config)
        self.to(draft.device)

    def get_input_embeddings(self):
        return self.draft.get_input_embeddings()

    def get_output_embeddings(self):
        return self.draft.get_output_embeddings()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, logits_to_keep=0,
                **options) -> CausalLMOutputWithPast:
        """The draft's forward under HF's names (``options`` as `SelfDraft.forward` reads them)."""
        out = self.draft(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, logits_to_keep=logits_to_keep, **options)
        return CausalLMOutputWithPast(logits=out.logits, **{_CACHE_FIELD: out.cache})


def self_draft_assistant(model, folder: str | Path = "artifacts/draft") -> SelfDraftAssistant:
    """The self-draft trained by ``branchpoint train-draft`` (``folder``) over ``model``, as an HF assistant."""
    from models.self_draft import load_self_draft

    return SelfDraftAssistant(load_self_draft(model, folder), model)
