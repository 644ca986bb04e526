"""Engine: Arbor's offline entry point. generate() takes one prompt or a batch and returns
the native API's response shape: {text, output_ids, meta_info}."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Sequence as Seq
from typing import Any

from runtime.config import ServerArgs
from runtime.offline_driver import OfflineDriver, Sequence
from runtime.sampling_params import SamplingParams
from runtime.tiny_model import builtin_model_path

logger = logging.getLogger(__name__)

Prompt = str | list[str] | None
InputIds = list[int] | list[list[int]] | None
Params = dict[str, Any] | list[dict[str, Any]] | None


class Engine:
    """Loads a checkpoint (None = the built-in tiny one) and generates in this process."""

    def __init__(self, model_path: str | None = None, **server_args: Any) -> None:
        from transformers import AutoTokenizer

        from runtime.model.runner import ModelRunner

        self.args = ServerArgs(model_path=model_path, **server_args)
        path = model_path or str(builtin_model_path())
        self.model_path = path
        self.runner = ModelRunner(self.args, path)  # validates the checkpoint first
        self.tokenizer = AutoTokenizer.from_pretrained(self.args.tokenizer_path or path, local_files_only=True)
        self.driver = OfflineDriver(self.runner, self.args.random_seed, self.args.max_running_requests)

    def generate(
        self, prompt: Prompt = None, input_ids: InputIds = None, sampling_params: Params = None
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Generate for one prompt (a dict back) or a list (a list back, in order)."""
        batch_ids, single = self._token_batches(prompt, input_ids)
        params = _per_request(sampling_params, len(batch_ids))
        seqs = [
            Sequence(uuid.uuid4().hex, ids, self._checked_params(ids, p))
            for ids, p in zip(batch_ids, params)
        ]
        self.driver.run(seqs)
        results = [self._result(s) for s in seqs]
        return results[0] if single else results

    def _token_batches(self, prompt: Prompt, input_ids: InputIds) -> tuple[list[list[int]], bool]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of prompt (text) or input_ids (token ids)")
        if prompt is not None:
            if isinstance(prompt, str):
                return [self.tokenizer.encode(prompt)], True
            if not prompt or not all(isinstance(p, str) for p in prompt):
                raise ValueError("prompt must be a string or a non-empty list of strings")
            return [self.tokenizer.encode(p) for p in prompt], False
        assert input_ids is not None
        if input_ids and all(isinstance(t, int) for t in input_ids):
            return [list(input_ids)], True  # type: ignore[arg-type]
        if input_ids and all(isinstance(x, list) and x and all(isinstance(t, int) for t in x) for x in input_ids):
            return [list(x) for x in input_ids], False  # type: ignore[union-attr]
        raise ValueError("input_ids must be a non-empty list of token ids or a list of such lists")

    def _checked_params(self, ids: list[int], raw: dict[str, Any] | None) -> SamplingParams:
        params = SamplingParams.from_dict(raw)
        context = self.runner.context_len
        vocab = self.runner.config.vocab_size
        if not ids:
            raise ValueError("the prompt is empty; give at least one token")
        if len(ids) >= context:
            raise ValueError(
                f"prompt has {len(ids)} tokens but the context length is {context}; "
                "shorten the prompt (at least one token must be generated)"
            )
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab})")
        # Generation stops at the context limit with finish reason "length".
        cap = context - len(ids)
        return dataclasses.replace(params, max_new_tokens=min(params.max_new_tokens, cap))

    def _result(self, s: Sequence) -> dict[str, Any]:
        return {
            "text": self.tokenizer.decode(s.output_ids, skip_special_tokens=True),
            "output_ids": s.output_ids,
            "meta_info": {
                "id": s.rid,
                "finish_reason": s.finish_reason,
                "prompt_tokens": len(s.input_ids),
                "completion_tokens": len(s.output_ids),
            },
        }

    def shutdown(self) -> None:
        """Release the model and KV cache."""
        self.runner = None  # type: ignore[assignment]
        self.driver = None  # type: ignore[assignment]

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _per_request(params: Params, n: int) -> Seq[dict[str, Any] | None]:
    if isinstance(params, list):
        if len(params) != n:
            raise ValueError(f"sampling_params has {len(params)} entries for {n} prompts")
        return params
    return [params] * n
