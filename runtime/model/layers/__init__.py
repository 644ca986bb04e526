"""The layers model files are built from. Each owns its share of the weights under tensor
parallelism and loads it from the checkpoint (`WeightLayer`); kernel selection and packing
reach them through their declared `kernel`, `act` and `pack`."""

from arbor.runtime.model.layers.linear import (
    ColumnParallelLinear,
    LinearLayer,
    MergedColumnParallelLinear,
    ParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from arbor.runtime.model.layers.mlp import GatedMLP
from arbor.runtime.model.layers.norm import RMSNorm
from arbor.runtime.model.layers.rotary import RotaryEmbedding, rope_inv_freq
from arbor.runtime.model.layers.vocab import ParallelLMHead, TiedLMHead, VocabParallelEmbedding
from arbor.runtime.model.layers.weight_layer import ShardId, WeightLayer

__all__ = [
    "ColumnParallelLinear",
    "GatedMLP",
    "LinearLayer",
    "MergedColumnParallelLinear",
    "ParallelLMHead",
    "ParallelLinear",
    "QKVParallelLinear",
    "RMSNorm",
    "RotaryEmbedding",
    "RowParallelLinear",
    "ShardId",
    "TiedLMHead",
    "VocabParallelEmbedding",
    "WeightLayer",
    "rope_inv_freq",
]
