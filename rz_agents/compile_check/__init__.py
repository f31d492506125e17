"""The compile check's model side: drive the engine's and the learner's real code paths at recipe shapes on
meta tensors and record their Triton launches (rz_kernels.compile_check compiles and costs them)."""
