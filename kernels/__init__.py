"""Triton kernels, each beside its torch reference with the same signature."""
