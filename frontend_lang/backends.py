"""Where a DSL program's calls go: an Arbor server (RuntimeEndpoint), an in-process Engine
(EngineBackend), or any OpenAI-compatible endpoint (OpenAI).

Every backend answers four calls: `generate` (text -> text + meta_info), `stream` (text ->
pieces), `cache_prefix` (prefill only, so later calls hit the radix cache; returns its token
count) and `select` (score choices by prompt logprobs in one batched call).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

from arbor.frontend_lang.chat_template import ChatTemplate, get_chat_template

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

SELECT_METHODS = ("token_length_normalized", "greedy_token")


class BackendError(RuntimeError):
    """The backend refused or failed a call; the message says why."""


class Backend(ABC):
    """What the interpreter calls. A program's role text comes from `chat_template`: the named
    template, else the checkpoint's (`chat_roles` of model_info), else "default"."""

    def __init__(self, chat_template: str | None = None) -> None:
        self._template_name = chat_template
        self._template: ChatTemplate | None = None

    @property
    def chat_template(self) -> ChatTemplate:
        if self._template is None:
            if self._template_name:
                self._template = get_chat_template(self._template_name)
            else:
                roles = self.model_info().get("chat_roles")
                self._template = (
                    ChatTemplate.from_markers("checkpoint", roles) if roles else get_chat_template("default")
                )
        return self._template

    @abstractmethod
    def generate(
        self, text: str, params: dict[str, Any], return_logprob: bool = False, top_logprobs_num: int = 0
    ) -> tuple[str, dict[str, Any]]:
        """Continue `text`: (generated text, meta_info)."""

    @abstractmethod
    def stream(self, text: str, params: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """(new piece, meta_info) as the text grows; the last meta_info is the final one."""

    @abstractmethod
    def cache_prefix(self, text: str) -> int:
        """Prefill `text` only so later calls reuse its KV; its token count."""

    @abstractmethod
    def select(
        self, text: str, choices: list[str], temperature: float, method: str
    ) -> tuple[int, list[float], dict[str, Any]]:
        """(index of the chosen choice, per-choice scores, meta)."""

    @abstractmethod
    def model_info(self) -> dict[str, Any]:
        """What the backend knows of its model (chat_roles among it, if any)."""

    @abstractmethod
    def flush_cache(self) -> None:
        """Drop the backend's cached prefixes."""


class NativeBackend(Backend):
    """Arbor's native API, over HTTP (RuntimeEndpoint) or in process (EngineBackend): the two
    share every call and differ only in `_generate` / `_stream`."""

    @abstractmethod
    def _generate(self, body: dict[str, Any]) -> Any:
        """One native /generate body -> its response (a list for a batch)."""

    @abstractmethod
    def _stream(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """One streamed native /generate body -> its chunks (cumulative text)."""

    def generate(
        self, text: str, params: dict[str, Any], return_logprob: bool = False, top_logprobs_num: int = 0
    ) -> tuple[str, dict[str, Any]]:
        out = self._generate(
            {
                "text": text,
                "sampling_params": params,
                "return_logprob": return_logprob,
                "top_logprobs_num": top_logprobs_num,
            }
        )
        return out["text"], out["meta_info"]

    def stream(self, text: str, params: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        seen = ""
        for chunk in self._stream({"text": text, "sampling_params": params, "stream": True}):
            piece, seen = chunk["text"][len(seen) :], chunk["text"]
            yield piece, chunk["meta_info"]

    def cache_prefix(self, text: str) -> int:
        return int(
            self._generate({"text": text, "sampling_params": {"max_new_tokens": 0}})["meta_info"]["prompt_tokens"]
        )

    def select(
        self, text: str, choices: list[str], temperature: float, method: str
    ) -> tuple[int, list[float], dict[str, Any]]:
        """The prefix is cached first, then all choices are scored by their prompt logprobs in
        one batched prefill-only request."""
        if method not in SELECT_METHODS:
            raise ValueError(f"unknown choices_method {method!r}; choose {', '.join(SELECT_METHODS)}")
        if not choices:
            raise ValueError("select needs at least one choice")
        prefix_len = self.cache_prefix(text)
        start = max(prefix_len - 1, 0)
        outs = self._generate(
            {
                "text": [text + c for c in choices],
                "sampling_params": {"max_new_tokens": 0},
                "return_logprob": True,
                "logprob_start_len": start,
            }
        )
        token_logprobs = []
        for out in outs:
            entries = out["meta_info"]["input_token_logprobs"]
            total = out["meta_info"]["prompt_tokens"]
            first = min(prefix_len, total - 1)  # the choice's tokens (at least one)
            token_logprobs.append([e[0] for e in entries[first - start :] if e[0] is not None])
        if method == "greedy_token":
            scores = [lps[0] if lps else -math.inf for lps in token_logprobs]
        else:
            scores = [sum(lps) / len(lps) if lps else -math.inf for lps in token_logprobs]
        best = max(range(len(choices)), key=lambda i: scores[i])
        return best, scores, {"prompt_tokens": prefix_len, "token_logprobs": token_logprobs}


class RuntimeEndpoint(NativeBackend):
    """An Arbor (or SGLang) server's native API at `base_url`."""

    def __init__(
        self, base_url: str, api_key: str | None = None, chat_template: str | None = None, timeout_s: float = 600.0
    ) -> None:
        super().__init__(chat_template)
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self._info: dict[str, Any] | None = None

    def _request(self, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path, data=data, headers=headers, method="GET" if body is None else "POST"
        )
        try:
            return urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as err:
            raise BackendError(f"{path}: HTTP {err.code}: {err.read().decode(errors='replace')}") from None

    def _generate(self, body: dict[str, Any]) -> Any:
        with self._request("/generate", body) as resp:
            return json.loads(resp.read())

    def _stream(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        with self._request("/generate", body) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    return
                yield json.loads(data)

    def model_info(self) -> dict[str, Any]:
        if self._info is None:
            with self._request("/get_model_info") as resp:
                self._info = json.loads(resp.read())
        return self._info

    def server_info(self) -> dict[str, Any]:
        """/get_server_info: the scheduler's counters (cache_hit_rate, ...)."""
        with self._request("/get_server_info") as resp:
            return json.loads(resp.read())

    def flush_cache(self) -> None:
        self._request("/flush_cache", {}).close()


class EngineBackend(NativeBackend):
    """An in-process `runtime.Engine` (pass one, or Engine keywords to start one)."""

    def __init__(self, engine: Any = None, chat_template: str | None = None, **engine_args: Any) -> None:
        super().__init__(chat_template)
        if engine is None:
            from arbor.runtime.engine import Engine

            engine = Engine(**engine_args)
            self._owned = True
        else:
            self._owned = False
        self.engine = engine

    def _generate(self, body: dict[str, Any]) -> Any:
        text = body.pop("text")
        return self.engine.generate(text, **body)  # with stream=True: an iterator of chunks

    _stream = _generate

    def model_info(self) -> dict[str, Any]:
        return self.engine.get_model_info()

    def flush_cache(self) -> None:
        self.engine.flush_cache()

    def shutdown(self) -> None:
        if self._owned:
            self.engine.shutdown()


class OpenAI(Backend):
    """Any OpenAI-compatible endpoint through the official `openai` client. Programs with
    roles go to chat completions (the server applies its own template), others to
    completions. `select` needs logprobs: it scores each choice's first token from the top
    logprobs of one token (greedy_token), so choices should differ in their first token."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None) -> None:
        super().__init__("default")
        from openai import OpenAI as Client

        self.model = model
        self.client = Client(base_url=base_url, api_key=api_key or "none")

    def chat(self, messages: list[dict[str, str]], params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The next assistant message for `messages` (chat completions)."""
        params = dict(params)
        extra: dict[str, Any] = {}
        if "json_schema" in params:
            schema = json.loads(params.pop("json_schema"))
            extra["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
        wire = cast("list[ChatCompletionMessageParam]", messages)  # {"role", "content"} dicts
        reply = self.client.chat.completions.create(model=self.model, messages=wire, **_openai(params), **extra)
        return reply.choices[0].message.content or "", _usage(reply)

    def generate(
        self, text: str, params: dict[str, Any], return_logprob: bool = False, top_logprobs_num: int = 0
    ) -> tuple[str, dict[str, Any]]:
        reply = self.client.completions.create(model=self.model, prompt=text, **_openai(params))
        return reply.choices[0].text, _usage(reply)

    def stream(self, text: str, params: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        for chunk in self.client.completions.create(model=self.model, prompt=text, stream=True, **_openai(params)):
            if chunk.choices:
                yield chunk.choices[0].text, {}

    def cache_prefix(self, text: str) -> int:
        return 0  # the OpenAI API has no prefill-only call; the server's cache still sees the prefix later

    def select(
        self, text: str, choices: list[str], temperature: float, method: str
    ) -> tuple[int, list[float], dict[str, Any]]:
        if not choices:
            raise ValueError("select needs at least one choice")
        reply = self.client.completions.create(model=self.model, prompt=text, max_tokens=1, temperature=0, logprobs=5)
        logprobs = reply.choices[0].logprobs
        top = logprobs.top_logprobs[0] if logprobs and logprobs.top_logprobs else {}
        scores = [
            max((lp for tok, lp in top.items() if tok and (c.startswith(tok) or tok.startswith(c))), default=-math.inf)
            for c in choices
        ]
        best = max(range(len(choices)), key=lambda i: scores[i])
        return best, scores, {}

    def model_info(self) -> dict[str, Any]:
        return {"model_path": self.model}

    def flush_cache(self) -> None:
        pass


def _openai(params: dict[str, Any]) -> dict[str, Any]:
    """Native sampling params -> OpenAI keywords; what the API cannot express is refused."""
    names = {
        "max_new_tokens": "max_tokens",
        "temperature": "temperature",
        "top_p": "top_p",
        "stop": "stop",
        "frequency_penalty": "frequency_penalty",
        "presence_penalty": "presence_penalty",
        "seed": "seed",
    }
    extra = sorted(set(params) - set(names))
    if extra:
        raise ValueError(f"the OpenAI backend cannot pass {', '.join(extra)}; use RuntimeEndpoint for these")
    return {names[k]: v for k, v in params.items()}


def _usage(reply: Any) -> dict[str, Any]:
    usage = getattr(reply, "usage", None)
    details = getattr(usage, "prompt_tokens_details", None)
    return {
        "prompt_tokens": getattr(usage, "prompt_tokens", 0),
        "completion_tokens": getattr(usage, "completion_tokens", 0),
        "cached_tokens": getattr(details, "cached_tokens", 0) or 0,
        "finish_reason": None,
    }
