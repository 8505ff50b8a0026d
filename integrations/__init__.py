"""Our exported selectors inside decoding runtimes nobody here wrote (`integrations.transformers`: HF generate()).

The top layer beside `pipeline/`: it may import torch, the runtime and the numpy-only modules of `decoding/`,
`export.runtime`, and (for the self-draft) `models/`; never `engine` (a runtime does not need our decoder),
and nothing of ours imports it.
"""
