"""Constrained decoding: constraint compile and cache, token FSM, jump-forward, bitmasks."""
