"""Running programs: each ProgramState owns a StreamExecutor thread that executes the
expressions appended to it in order, so program code runs ahead while the backend works;
reading a variable blocks until it is generated. `fork` commits the shared prefix to the
cache (prefill only) and then runs every branch on its own thread, concurrently.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from arbor.frontend_lang.backends import Backend
from arbor.frontend_lang.ir import (
    Expr,
    Gen,
    RoleBegin,
    RoleEnd,
    SamplingParams,
    Select,
    Text,
    VarScopeBegin,
    VarScopeEnd,
    as_expr,
    flatten,
)

_POLL_S = 0.05


class StreamExecutor:
    """Executes one state's expressions on a worker thread; holds its text, chat messages,
    variables and the meta_info of each generation."""

    def __init__(self, backend: Backend, defaults: SamplingParams, stream: bool) -> None:
        self.backend = backend
        self.defaults = defaults
        self.stream = stream
        self.text = ""
        self.messages: list[dict[str, str]] = []
        self.variables: dict[str, Any] = {}
        self.meta: dict[str, dict[str, Any]] = {}
        self.children: list[StreamExecutor] = []
        self._role: tuple[str, int] | None = None  # open role and where its content starts
        self._scopes: dict[str, int] = {}
        self._set: dict[str, threading.Event] = {}
        self._error: BaseException | None = None
        self._pieces: list[tuple[str | None, str]] = []  # (variable or None, text) for text_iter
        self._changed = threading.Condition()
        self._finished = False
        self._unnamed = 0
        self._queue: queue.Queue[Expr | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="sgl-state", daemon=True)
        self._thread.start()

    def copy(self) -> StreamExecutor:
        """A new executor (thread) starting from this one's text, messages and variables."""
        child = StreamExecutor(self.backend, self.defaults, self.stream)
        child.text, child.messages, child._role = self.text, list(self.messages), self._role
        child.variables, child.meta, child._scopes = dict(self.variables), dict(self.meta), dict(self._scopes)
        for name in child.variables:
            child._event(name).set()
        self.children.append(child)
        return child

    # ---------------------------------------------------------------- caller side

    def submit(self, expr: Expr) -> None:
        if self._finished:
            raise RuntimeError("this program state has ended; it takes no more expressions")
        for leaf in flatten(expr):
            self._queue.put(leaf)

    def sync(self) -> None:
        """Wait until everything submitted has run; re-raise a backend error here."""
        self._queue.join()
        self._raise()

    def end(self) -> None:
        """No more expressions: the thread exits once the queue drains (forks too)."""
        if not self._finished:
            self._finished = True
            self._queue.put(None)
        for child in self.children:
            child.end()

    def get_var(self, name: str) -> Any:
        event = self._event(name)
        while not event.wait(_POLL_S):
            self._raise()
            if self._queue.unfinished_tasks == 0 and not event.is_set():
                raise KeyError(f"the program generated no variable {name!r}; it has {sorted(self.variables)}")
        self._raise()
        return self.variables[name]

    def set_var(self, name: str, value: Any, meta: dict[str, Any] | None = None) -> None:
        self.variables[name] = value
        if meta is not None:
            self.meta[name] = meta
        self._event(name).set()

    def text_iter(self, var: str | None = None) -> Iterator[str]:
        """Pieces of text as they are added (only those of `var` if given), until the end."""
        at = 0
        while True:
            with self._changed:
                self._changed.wait_for(functools.partial(self._grown, at), timeout=_POLL_S)
                batch, done = self._pieces[at:], self._done()
            at += len(batch)
            for name, piece in batch:
                if var is None or name == var:
                    yield piece
            if done and at == len(self._pieces):
                self._raise()
                return

    # ---------------------------------------------------------------- worker side

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._error is None:
                    self._run(item)
            except BaseException as exc:
                self._error = exc
                for event in list(self._set.values()):
                    event.set()
            finally:
                self._queue.task_done()
                with self._changed:
                    self._changed.notify_all()

    def _run(self, item: Expr) -> None:
        if isinstance(item, Text):
            self._append(item.text, None)
        elif isinstance(item, Gen):
            self._gen(item)
        elif isinstance(item, Select):
            index, scores, meta = self.backend.select(self.text, item.choices, item.temperature, item.choices_method)
            name = item.name or self._anonymous()
            self._append(item.choices[index], name)
            self.set_var(name, item.choices[index], {**meta, "scores": scores})
        elif isinstance(item, RoleBegin):
            if self._role is not None:
                raise ValueError(f"role {item.role!r} opened inside role {self._role[0]!r}; end that one first")
            self._append(self.backend.chat_template.prefix(item.role), None)
            self._role = (item.role, len(self.text))
        elif isinstance(item, RoleEnd):
            if self._role is None or self._role[0] != item.role:
                raise ValueError(f"{item.role}_end() without a matching {item.role}_begin()")
            self.messages.append({"role": item.role, "content": self.text[self._role[1] :]})
            self._role = None
            self._append(self.backend.chat_template.suffix(item.role), None)
        elif isinstance(item, VarScopeBegin):
            self._scopes[item.name] = len(self.text)
        elif isinstance(item, VarScopeEnd):
            self.set_var(item.name, self.text[self._scopes.pop(item.name) :])
        else:
            raise TypeError(f"a program state cannot take {type(item).__name__}")

    def _gen(self, item: Gen) -> None:
        params = item.params.merged(self.defaults)
        name = item.name or self._anonymous()
        chat = getattr(self.backend, "chat", None)
        meta: dict[str, Any]
        if chat is not None and self._role is not None and self._role[0] == "assistant":
            text, meta = chat(self.messages, params)  # OpenAI chat endpoints apply their own template
            self._append(text, name)
        elif self.stream:
            meta = {}
            parts = []
            for piece, info in self.backend.stream(self.text, params):
                parts.append(piece)
                self._append(piece, name)
                meta = info
            text = "".join(parts)
        else:
            text, meta = self.backend.generate(self.text, params, item.return_logprob, item.top_logprobs_num)
            self._append(text, name)
        self.set_var(name, text, meta)

    def _append(self, piece: str, var: str | None) -> None:
        if not piece:
            return
        self.text += piece
        with self._changed:
            self._pieces.append((var, piece))
            self._changed.notify_all()

    def _anonymous(self) -> str:
        self._unnamed += 1
        return f"_gen_{self._unnamed}"

    def _event(self, name: str) -> threading.Event:
        return self._set.setdefault(name, threading.Event())

    def _grown(self, seen: int) -> bool:
        """Whether text came after the first `seen` pieces, or the program ended."""
        return len(self._pieces) > seen or self._done()

    def _done(self) -> bool:
        return self._finished and self._queue.unfinished_tasks == 0

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error


class ProgramState:
    """The `s` of a program: `s += expr`, `s["name"]`, `s.text()`, `s.messages()`, roles
    as context managers, `s.fork(n)`, `s.text_iter()`."""

    def __init__(self, executor: StreamExecutor) -> None:
        self.executor = executor

    def __iadd__(self, other: Any) -> ProgramState:
        self.executor.submit(as_expr(other))
        return self

    def __getitem__(self, name: str) -> Any:
        return self.executor.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.executor.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self.executor.variables

    def get_var(self, name: str) -> Any:
        return self[name]

    def set_var(self, name: str, value: Any) -> None:
        self[name] = value

    def get_meta_info(self, name: str) -> dict[str, Any]:
        """meta_info of the generation that produced `name` (cached_tokens, finish_reason...)."""
        self.executor.get_var(name)
        return self.executor.meta.get(name, {})

    def sync(self) -> ProgramState:
        self.executor.sync()
        return self

    def text(self) -> str:
        self.sync()
        return self.executor.text

    def messages(self) -> list[dict[str, str]]:
        self.sync()
        return list(self.executor.messages)

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        return self.executor.text_iter(var_name)

    def fork(self, size: int = 1) -> ProgramStateGroup:
        """`size` branches from the current text. The shared prefix is prefilled first (no
        tokens generated), so every branch's first call hits the radix cache."""
        self.sync()
        if self.executor.text:
            self.executor.backend.cache_prefix(self.executor.text)
        return ProgramStateGroup([ProgramState(self.executor.copy()) for _ in range(size)], self)

    @contextmanager
    def _scope(self, begin: Expr, end: Expr) -> Iterator[None]:
        self += begin
        yield
        self += end

    def system(self) -> Any:
        return self._scope(RoleBegin("system"), RoleEnd("system"))

    def user(self) -> Any:
        return self._scope(RoleBegin("user"), RoleEnd("user"))

    def assistant(self) -> Any:
        return self._scope(RoleBegin("assistant"), RoleEnd("assistant"))

    def var_scope(self, name: str) -> Any:
        """`with s.var_scope("x"):` the text added inside becomes variable x."""
        return self._scope(VarScopeBegin(name), VarScopeEnd(name))

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ProgramStateGroup:
    """The branches of a fork: index them, `+=` to all (a callable gets the branch index),
    and `join()`."""

    def __init__(self, states: list[ProgramState], parent: ProgramState) -> None:
        self.states = states
        self.parent = parent
        self._start = len(parent.executor.text)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, state: ProgramState) -> None:
        # `forks[i] += expr` assigns back the branch its __iadd__ returned: the same object.
        if state is not self.states[i]:
            raise TypeError("a fork's branches cannot be replaced; append to them with +=")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any | Callable[[int], Any]) -> ProgramStateGroup:
        for i, state in enumerate(self.states):
            state += other(i) if callable(other) else other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for every branch. gather_variable: variables new in the branches become lists
        in the parent; concate_and_append: the branches' new text is appended to the parent.
        Branches stay usable (fork them again); they end with the program."""
        if mode not in ("gather_variable", "concate_and_append"):
            raise ValueError(f"unknown join mode {mode!r}; choose gather_variable or concate_and_append")
        for state in self.states:
            state.sync()
        if mode == "concate_and_append":
            self.parent += "".join(s.executor.text[self._start :] for s in self.states)
            return
        parent = self.parent.executor
        known = set(parent.variables)
        gathered: dict[str, list[Any]] = {}
        for state in self.states:
            for name, value in state.executor.variables.items():
                if name not in known and not name.startswith("_gen_"):
                    gathered.setdefault(name, []).append(value)
        for name, values in gathered.items():
            parent.set_var(name, values)
