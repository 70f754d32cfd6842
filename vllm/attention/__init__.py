"""Attention backends: one interface (build per-step metadata from the flat batch, run a
layer's attention), chosen once per model by the platform. See backends/abstract.py."""
