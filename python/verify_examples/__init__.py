"""Implementations for python/mhar_verify.py (docs/verify.md): a NumPy reference and planted
candidates, a PyTorch eager twin and its hf-rmsnorm variant, and adapters for three peers' public
signatures (fla, Liger, a multi-head block kernel) tested on stand-ins with those signatures."""
