"""LoRA adapters on pooling models: requests, PEFT files, per-step batched deltas."""
