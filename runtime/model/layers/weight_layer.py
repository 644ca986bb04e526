"""The contract between a layer and the checkpoint: every layer loads its own share of its
parameters (nano-vllm's `weight_loader`), so a model file holds only its architecture."""

from __future__ import annotations

import torch
from torch import nn

from arbor.runtime.model.errors import CheckpointError
from arbor.runtime.model.weights.base import Part

# Which of the checkpoint tensors fused into one parameter a tensor is ("q", "k", "v" of a
# QKV projection; 0, 1 of gate/up); None where a parameter comes from one tensor.
ShardId = str | int | None


class WeightLayer(nn.Module):
    """A layer that fills its own parameters from checkpoint tensors.

    The model maps each checkpoint name to (layer, parameter, shard id). The weight source reads
    only the part (weights/base.py) `checkpoint_part` names; `weight_loader` puts it in place. Once every tensor
    has arrived, what `expected_weights` lists and did not arrive is what the checkpoint lacks,
    and `finish_loading` runs. By default each parameter loads whole from one tensor.
    """

    def checkpoint_part(self, param: str, shard_id: ShardId = None) -> Part | None:
        """The part of the checkpoint tensor for `param` (and shard) this rank holds; None: all."""
        return None

    def weight_loader(self, param: str, tensor: torch.Tensor, shard_id: ShardId = None) -> None:
        """Copy `tensor` (the part `checkpoint_part` names) into parameter `param`."""
        copy_checked(self.parameter(param), tensor)

    def expected_weights(self) -> set[tuple[str, ShardId]]:
        """(parameter, shard id) of every checkpoint tensor this layer needs."""
        return {(name, None) for name, _ in self.named_parameters(recurse=False)}

    def finish_loading(self, where: str) -> None:
        """Runs once every checkpoint tensor is in; `where` is the layer's name in the model."""

    def parameter(self, name: str) -> torch.Tensor:
        """The data of this layer's own parameter `name`; CheckpointError if it has none."""
        param = self._parameters.get(name)
        if param is None:
            raise CheckpointError(f"has no place in {type(self).__name__}")
        return param.data


def copy_checked(dest: torch.Tensor, tensor: torch.Tensor) -> None:
    """dest <- tensor, or CheckpointError naming both shapes."""
    if dest.shape != tensor.shape:
        raise CheckpointError(f"shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}")
    dest.copy_(tensor)
