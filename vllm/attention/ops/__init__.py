"""Device kernels the attention backends launch (Triton; imported lazily by the backends,
because `@triton.jit` fixes interpreter or compiled mode when the module is imported)."""
