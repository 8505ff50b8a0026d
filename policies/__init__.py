"""The decoding policies above the engine, and their one constructor.

`policies.registry.build_policy(name, cfg)` builds every policy decode, evaluate, the benchmarks and the transformers
integration run: static trees, autoregressive, the adaptive chain (`policies.adaptive_chain`), the confidence-threshold
chain (`policies.threshold_chain`), prompt lookup first (`policies.lookup`) and the exported selector
(`export.runtime.SelectorRuntime`). The engine (`engine`) knows only the protocol of `decoding.policy`: a
policy's `Choice` asks it to draft a tree, to verify a proposed chain, or to draft a chain with a stop rule.
Numpy only (the selector adds onnxruntime): a runtime that is not ours can use them as they are.
"""
