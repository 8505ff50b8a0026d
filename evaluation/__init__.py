"""Evaluation of policies (below `pipeline/`, above `decoding/` and `models/`).

- `online`: TEST prompts decoded end to end by each policy through the one decoder; offline TPS from
  the labels; acceptance by depth; the selector's choices.
- `paired_stats`: paired bootstrap intervals of tokens/s ratios (by prompt and seed).
- `claims`: the paper's claims checked on the collected labels (rank of methods, chain vs tree, ...).
- `report`: the markdown report, its figures and the `dvc plots` data.
"""
