"""Quantized checkpoints: what their configs say (`config.py`), how their tensors decode
into one integer or float8 form (`formats.py`), and the linear layers that run them
(`linear.py`), each beside a dequantize-then-matmul reference."""
