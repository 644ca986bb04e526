"""CausalLM: the contract every model implementation keeps with the loader, the runner,
kernel selection, packing, the quantizer and the speculative draft.

A model file holds only its architecture: it builds itself from layers (`layers/`) that own
their share of the weights and load it, declares which checkpoint tensors it fuses
(`packed_modules_mapping`), and computes `forward`. Loading, checkpoint slicing and the
quantizer's view of its linears are implemented here once, over the layers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from arbor.runtime.model.errors import CheckpointError
from arbor.runtime.model.layers import LinearLayer, ShardId, VocabParallelEmbedding, WeightLayer
from arbor.runtime.model.parallel import SINGLE, TensorParallel
from arbor.runtime.model.weights.base import Part

if TYPE_CHECKING:
    from arbor.runtime.model.forward_batch import ForwardBatch
    from arbor.runtime.model.model_config import ModelConfig

HEAD = "lm_head"  # the one module whose checkpoint name has no "model." prefix


class CausalLM(nn.Module, ABC):
    """A decoder-only language model over this rank's share of the weights.

    - Built on the meta device by `registry.model_class(arch)(config, tp)`, then filled by
      `load_weights`; the weight source reads of each checkpoint tensor only the part
      `shard(name)` names.
    - Every parameter belongs to a `WeightLayer`. Checkpoint names are Hugging Face's: ours
      with a `model.` prefix (except `lm_head`), with the tensors of `packed_modules_mapping`
      fused into one layer each.
    - `forward(batch)` gives the final hidden states [T, hidden] of the batch's new tokens;
      `logits(hidden)` the full-vocabulary logits in the model's dtype.
    - `lm_head` maps hidden states to this rank's logits columns; a speculative draft may replace
      it (spec/frequent_token_head.py) before packing.
    """

    # checkpoint layer name -> (our fused layer name, shard id), e.g. q_proj -> (qkv_proj, "q")
    packed_modules_mapping: ClassVar[dict[str, tuple[str, ShardId]]] = {}
    ignored_weights: ClassVar[tuple[str, ...]] = ("rotary_emb.inv_freq",)  # tensors models never read

    embed_tokens: VocabParallelEmbedding
    lm_head: nn.Module

    def __init__(self, config: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        tp.check(config.num_heads, config.num_kv_heads, config.intermediate_size)
        self.config, self.tp = config, tp

    @abstractmethod
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Final hidden states [T, hidden] of every new token of `batch`."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] in the model's dtype for hidden states [N, hidden]."""
        return self.tp.gather_vocab(self.lm_head(hidden), self.config.vocab_size)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Fill the model from (Hugging Face name, tensor) pairs, each tensor being the part
        `shard(name)` names; every layer must get every tensor it expects exactly as named, or
        CheckpointError names what is missing or has no place."""
        names = {layer: name for name, layer in reversed(self.weight_layers().items())}  # first names
        loaded: dict[WeightLayer, set[tuple[str, ShardId]]] = {layer: set() for layer in names}
        for hf_name, tensor in weights:
            if any(part in hf_name for part in self.ignored_weights):
                continue
            module, param, shard_id = self._target(hf_name)
            layer = self._layer(module)
            if layer is None:
                raise CheckpointError(f"checkpoint tensor {hf_name!r} has no place in {type(self).__name__}")
            try:
                layer.weight_loader(param, tensor, shard_id)
            except CheckpointError as e:
                raise CheckpointError(f"checkpoint tensor {hf_name!r}: {e}") from None
            loaded[layer].add((param, shard_id))
        missing = [
            f"{names[layer]}.{param}"
            for layer, got in loaded.items()
            for param, _ in sorted(layer.expected_weights() - got, key=str)
        ]
        if missing:
            raise CheckpointError(f"checkpoint lacks weights for {', '.join(list(dict.fromkeys(missing))[:5])}")
        for layer, name in names.items():
            layer.finish_loading(name)

    def shard(self, hf_name: str) -> Part | None:
        """The part (dim, lo, hi) of checkpoint tensor `hf_name` this rank holds; None: all of it."""
        module, param, shard_id = self._target(hf_name)
        layer = self._layer(module)
        return None if layer is None else layer.checkpoint_part(param, shard_id)

    def linear_parts(self, name: str) -> list[tuple[str, int, int]]:
        """The checkpoint layers fused into our linear layer `name`: (HF name, first row, rows)."""
        layer = self.get_submodule(name)
        if not isinstance(layer, LinearLayer):
            raise TypeError(f"{name} is a {type(layer).__name__}, not a linear layer")
        prefix, _, leaf = name.rpartition(".")
        unfused = {target: part for part, target in self.packed_modules_mapping.items()}
        return [
            (self._checkpoint_name(prefix, unfused.get((leaf, shard_id), leaf)), lo, rows)
            for shard_id, lo, rows in layer.output_shards()
        ]

    def weight_layers(self) -> dict[str, WeightLayer]:
        """Every WeightLayer under every name it is reachable by (a tied head's embedding
        too); a parameter held by any other module is a bug in the model file."""
        layers = {}
        for name, module in self.named_modules(remove_duplicate=False):
            if isinstance(module, WeightLayer):
                layers[name] = module
            elif next(module.parameters(recurse=False), None) is not None:
                raise TypeError(
                    f"{type(self).__name__}.{name}: parameters outside a WeightLayer "
                    f"({type(module).__name__}) cannot be loaded"
                )
        return layers

    def _layer(self, name: str) -> WeightLayer | None:
        try:
            layer = self.get_submodule(name)
        except AttributeError:
            return None
        return layer if isinstance(layer, WeightLayer) else None

    def _target(self, hf_name: str) -> tuple[str, str, ShardId]:
        """Our layer, parameter and shard id for a Hugging Face tensor name."""
        name = hf_name.removeprefix("model.")
        shard_id: ShardId = None
        for part, (fused, shard) in self.packed_modules_mapping.items():
            if f".{part}." in name:
                name, shard_id = name.replace(f".{part}.", f".{fused}."), shard
                break
        module, _, param = name.rpartition(".")
        return module, param, shard_id

    @staticmethod
    def _checkpoint_name(prefix: str, leaf: str) -> str:
        name = f"{prefix}.{leaf}" if prefix else leaf
        return name if name == HEAD else f"model.{name}"
