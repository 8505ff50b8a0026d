"""The selector of ALGORITHMS.md section 6: its network (`network`), training data (`data`), objectives and
Lightning training (`training`), held-out report from labels and prices (`report`), scikit-learn baselines
(`baselines`) and diagnostic plots (`plots`). Stage train and chain_selector run it; export turns the network
into ONNX."""
