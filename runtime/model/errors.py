"""Errors about checkpoints, shared by the config, the loader and the quantized formats."""


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be served; the message names the problem."""
