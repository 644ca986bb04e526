"""The compile service: outlines-core 0.2.14 regressions, limits, caches, errors."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from arbor.grammar.backends.outlines import GrammarMatcher
from arbor.grammar.compiler import CompilerConfig, GrammarBusy, GrammarCompiler, GrammarError
from arbor.grammar.constraint import Constraint, constraint_from_params


def accepts(family, params: dict, text: str) -> bool:
    """Whether the token FSM takes `text` (canonically tokenized) as a complete output."""
    matcher = GrammarMatcher(family.compiler.compile(constraint_from_params(dict(params))))
    ids = family.retok.encode(text.encode())
    return matcher.accept_tokens(ids) and matcher.allows_end()


@pytest.mark.parametrize(
    ("params", "text"),
    [
        ({"regex": r"[0-9]+(\.[0-9]+)?"}, "3.14"),
        ({"regex": r"(yes|no)(, (yes|no))*"}, "yes, no, yes"),
        ({"json_schema": {"type": "number"}}, "3.14"),
        ({"json_schema": {"type": "array", "items": {"type": "number"}}}, "[1.5, 2.25]"),
    ],
)
def test_tokens_past_a_possible_end_are_kept(family, params: dict, text: str) -> None:
    # outlines-core 0.2.14 alone rejects "." after "3" and "," after "yes" here.
    assert accepts(family, params, text)


def test_the_fsm_rejects_what_the_regex_rejects(family) -> None:
    assert not accepts(family, {"regex": r"[0-9]+(\.[0-9]+)?"}, "3.")
    assert not accepts(family, {"json_schema": {"type": "integer", "minimum": 10, "maximum": 20}}, "21")
    assert accepts(family, {"json_schema": {"type": "integer", "minimum": 10, "maximum": 20}}, "15")


def test_eos_only_where_the_output_may_end(family) -> None:
    matcher = GrammarMatcher(family.compiler.compile(Constraint("regex", "ab|abcd")))
    assert not matcher.allows_end()
    assert matcher.accept_tokens(family.retok.encode(b"ab"))
    assert matcher.allows_end() and not matcher.is_terminated()
    assert matcher.forced_bytes() == b""  # may end here, so "cd" is not forced
    assert matcher.accept_tokens(family.retok.encode(b"cd")) and matcher.is_terminated()


def test_forced_bytes_follow_the_schema(family) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    matcher = GrammarMatcher(family.compiler.compile(constraint_from_params({"json_schema": schema})))
    assert matcher.forced_bytes() == b'{"name": "'


def _bits(row: np.ndarray) -> set[int]:
    return set(np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")).tolist())


def test_guide_written_masks_equal_the_index_lists(family) -> None:
    # Each state's mask is written by the matcher's Guide; it must hold exactly the index's
    # allowed tokens, with the sentinel shown as EOS.
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "tag": {"enum": ["a", "bc"]},
            "note": {"type": "string", "maxLength": 3},
        },
        "required": ["id", "tag", "note"],
    }
    grammar = family.compiler.compile(constraint_from_params({"json_schema": schema}))
    matcher = GrammarMatcher(grammar)
    tables = grammar.tables
    row = np.zeros(tables.words, dtype=np.int32)
    text = rb'{"id": -12, "tag": "bc", "note": "x\\y"}'
    seen = 0
    for tok in family.retok.encode(text):
        matcher.fill_bitmask(row)
        listed = set(grammar.index.get_allowed_tokens(matcher.state)) - set(tables.eos_ids.tolist())
        if tables.sentinel in listed:
            listed = (listed - {tables.sentinel}) | set(tables.eos_ids.tolist())
        assert _bits(row) == listed
        assert matcher.accept_token(tok)
        seen += 1
    assert seen > 5 and matcher.allows_end()


def test_rollback_returns_to_the_earlier_state(family) -> None:
    matcher = GrammarMatcher(family.compiler.compile(Constraint("regex", "(ab|cd)+")))
    start = matcher.state
    ids = family.retok.encode(b"abcd")
    assert matcher.accept_tokens(ids)
    assert matcher.forced_bytes() == b""  # walks ahead and back without moving the matcher
    matcher.rollback(len(ids))
    assert matcher.state == start and matcher.accept_tokens(ids)
    assert not matcher.accept_tokens(family.retok.encode(b"ax")) and matcher.allows_end()


def test_compile_is_cached_in_memory(gpt2_family) -> None:
    c = constraint_from_params({"regex": "[a-f]{2,9}z"})
    first = gpt2_family.compiler.compile(c)
    start = time.perf_counter()
    again = gpt2_family.compiler.compile(c)
    assert again is first and time.perf_counter() - start < 0.01


def test_disk_cache_survives_a_new_compiler(gpt2_family, tmp_path) -> None:
    c = constraint_from_params({"regex": "[0-9]{3}-[a-z]{2}"})
    config = CompilerConfig(workers=1, cache_dir=str(tmp_path))
    for expected_disk_hits in (0, 1):
        compiler = GrammarCompiler(gpt2_family.vocab, config)
        try:
            compiler.compile(c)
            assert compiler.stats["disk_hits"] == expected_disk_hits
        finally:
            compiler.close()


def test_slow_compile_ends_with_a_timeout_error_and_the_worker_recovers(gpt2_family) -> None:
    compiler = GrammarCompiler(gpt2_family.vocab, CompilerConfig(workers=1, timeout_s=0.2))
    try:
        with pytest.raises(GrammarError, match=r"longer than 0\.2 s"):
            compiler.compile(Constraint("regex", "(?:[a-z0-9]{1,40}, ){1,60}"))
        assert compiler.compile(Constraint("regex", "ok")) is not None
    finally:
        compiler.close()


def test_a_failed_compile_is_remembered_and_a_resend_fails_at_once(gpt2_family) -> None:
    compiler = GrammarCompiler(gpt2_family.vocab, CompilerConfig(workers=1, timeout_s=0.3))
    slow = Constraint("regex", "(?:[a-z0-9]{1,40}, ){1,60}")
    try:
        with pytest.raises(GrammarError, match=r"longer than 0\.3 s"):
            compiler.compile(slow)
        started = time.perf_counter()
        with pytest.raises(GrammarError, match=r"longer than 0\.3 s"):
            compiler.compile(slow)
        assert time.perf_counter() - started < 0.05 and compiler.stats["errors"] == 1
    finally:
        compiler.close()


def test_the_compile_queue_is_bounded(gpt2_family) -> None:
    compiler = GrammarCompiler(gpt2_family.vocab, CompilerConfig(workers=1, timeout_s=2, max_pending=2))
    slow = [Constraint("regex", f"(?:[a-z0-9]{{1,40}}, ){{1,{60 + i}}}") for i in range(3)]
    try:
        futures = [compiler.submit(c) for c in slow]
        with pytest.raises(GrammarBusy, match="retry shortly"):
            futures[2].result()
        quick = compiler.submit(Constraint("regex", "[0-9]+"))  # still refused while both are pending
        with pytest.raises(GrammarBusy):
            quick.result()
        for f in futures[:2]:
            with pytest.raises(GrammarError):
                f.result()
        assert compiler.compile(Constraint("regex", "[0-9]+")) is not None  # room again
    finally:
        compiler.close()


def test_memory_blowup_kills_only_the_worker(gpt2_family) -> None:
    compiler = GrammarCompiler(gpt2_family.vocab, CompilerConfig(workers=1, timeout_s=120, memory_mb=400))
    try:
        with pytest.raises(GrammarError, match="memory limit"):
            compiler.compile(Constraint("regex", "[a-z]*a[a-z]{24}"))
        assert compiler.compile(Constraint("regex", "fine")) is not None
    finally:
        compiler.close()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"json_schema": {"type": "integer", "minimum": 5, "maximum": 1}}, "minimum 5 is above maximum 1"),
        ({"json_schema": "{not json"}, "not valid JSON"),
        ({"json_schema": {"type": "thing"}}, "unknown type 'thing'"),
        ({"json_schema": {"$ref": "#/definitions/missing"}}, "points at nothing"),
        ({"json_schema": {"type": "string", "pattern": "(?=a)b"}}, "lookaround"),
        ({"regex": "(unclosed"}, "regex"),
        ({"choices": []}, "non-empty list"),
        ({"regex": "a", "choices": ["a"]}, "at most one"),
    ],
)
def test_bad_constraints_are_refused_with_a_reason(params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        constraint_from_params(dict(params))


def test_constraint_text_is_canonical() -> None:
    a = constraint_from_params({"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}})
    b = constraint_from_params(
        {"json_schema": json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}, indent=2)}
    )
    assert a == b and hash(a) == hash(b)
