"""Model implementations, one file per architecture, each a CausalLM (causal_lm.py) registered
by architecture name in registry.py."""
