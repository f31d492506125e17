"""Compile check: the Triton launches of a workload recorded without a GPU (recorder), compiled for GPU
targets with the wheel's own toolchain (compile), compared for byte identity between engine and trainer
(identity), and costed against the H200's roofline (cost_model)."""
