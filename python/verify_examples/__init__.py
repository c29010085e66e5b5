"""Implementations for python/mhar_verify.py: a NumPy reference, planted mistakes, a PyTorch
eager twin and an adapter for fla's naive_attnres signature (docs/verify.md)."""
