"""Dataclass fields as CLI flags (for runtime/config.py). A field carries its help text, and
its flag's name where that differs from the field's; a Section checks its choices and itself
when built; a FlagTable maps the flat flag names of a dataclass of sections to their fields."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")
_HINTS: dict[type, dict[str, Any]] = {}  # each class's resolved field types


def opt(default: Any, help: str, flag: str | None = None, choices: tuple[str, ...] | None = None) -> Any:
    """A field with its CLI help text; `flag` when the flag's name is not the field's, `choices`
    only for a str field whose choices come from a registry (else a Literal type states them)."""
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices})


class Section:
    """A group of fields that checks itself when built (also when decoded from JSON)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            hint = _hints(type(self))[f.name]
            allowed = _choices(hint, f)
            value = getattr(self, f.name)
            if allowed and value not in allowed and not (value is None and type(None) in typing.get_args(hint)):
                raise ValueError(
                    f"--{_flag_name(f).replace('_', '-')} must be one of {', '.join(allowed)}, got {value!r}"
                )
        self.validate()

    def validate(self) -> None:
        """The section's own checks; a ValueError names the flag to change."""


@dataclass(frozen=True)
class Flag:
    """One flag: the root's attribute holding its section (None: a field of the root itself),
    the field, and its type without `| None`."""

    section: str | None
    field: dataclasses.Field
    hint: Any

    @property
    def option(self) -> str:
        return "--" + _flag_name(self.field).replace("_", "-")


class FlagTable:
    """The flags of `root`, a dataclass whose fields are Sections (a group of flags each) or
    flags of its own, by flag name (`kv_cache_dtype`), in declaration order."""

    def __init__(self, root: type) -> None:
        self.root = root
        hints = _hints(root)
        self.sections: dict[str, type] = {
            f.name: hints[f.name]
            for f in dataclasses.fields(root)
            if isinstance(hints[f.name], type) and issubclass(hints[f.name], Section)
        }
        owners: list[tuple[str | None, type]] = [*self.sections.items(), (None, root)]
        self.flags = {
            _flag_name(f): Flag(section, f, _bare(_hints(owner)[f.name]))
            for section, owner in owners
            for f in dataclasses.fields(owner)
            if f.name not in self.sections or owner is not root
        }

    def value(self, obj: Any, name: str) -> Any:
        """The value of flag `name` in `obj`, wherever its section keeps it."""
        flag = self.flags[name]
        return getattr(obj if flag.section is None else getattr(obj, flag.section), flag.field.name)

    def replace(self, obj: T, **values: Any) -> T:
        """A copy of `obj` with `values` (by flag name) replaced; each changed section checks itself."""
        if unknown := sorted(set(values) - self.flags.keys()):
            raise TypeError(f"{self.root.__name__} has no flag {', '.join(unknown)}")
        own: dict[str, Any] = {}
        by_section: dict[str, dict[str, Any]] = {}
        for name, value in values.items():
            flag = self.flags[name]
            changed = own if flag.section is None else by_section.setdefault(flag.section, {})
            changed[flag.field.name] = value
        sections = {name: dataclasses.replace(getattr(obj, name), **changed) for name, changed in by_section.items()}
        return dataclasses.replace(obj, **sections, **own)  # type: ignore[type-var]

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """One `--flag` per field, with its type, default and help; a group per section."""
        groups: dict[str, Any] = {
            section: parser.add_argument_group(f"{section} ({owner.__name__})", (owner.__doc__ or "").split("\n\n")[0])
            for section, owner in self.sections.items()
        }
        for name, flag in self.flags.items():
            _add_argument(parser if flag.section is None else groups[flag.section], name, flag)

    def argv(self, obj: Any) -> list[str]:
        """The flags that rebuild `obj` from the defaults (defaults left out)."""
        argv: list[str] = []
        for name, flag in self.flags.items():
            value = self.value(obj, name)
            if value == flag.field.default:
                continue
            if flag.hint is bool:
                argv.append(flag.option if value else "--no-" + flag.option[2:])
            else:
                argv += [flag.option, str(value)]
        return argv


def _flag_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or f.name


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _bare(hint: Any) -> Any:
    """`hint` without its `| None`."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _choices(hint: Any, f: dataclasses.Field) -> tuple[str, ...] | None:
    """A field's allowed values: its Literal type's, or the registry's in its metadata."""
    bare = _bare(hint)
    return typing.get_args(bare) if typing.get_origin(bare) is Literal else f.metadata.get("choices")


def _add_argument(group: Any, name: str, flag: Flag) -> None:
    """On/off for a bool (`--no-flag` too when on by default), else typed, with its choices."""
    f, help_text = flag.field, flag.field.metadata["help"]
    if flag.hint is bool and f.default:
        group.add_argument(flag.option, dest=name, action=argparse.BooleanOptionalAction, default=True, help=help_text)
    elif flag.hint is bool:
        group.add_argument(flag.option, dest=name, action="store_true", help=help_text)
    else:
        group.add_argument(
            flag.option,
            dest=name,
            type=flag.hint if flag.hint in (int, float) else str,
            default=f.default,
            choices=_choices(flag.hint, f),
            help=f"{help_text} (default: {f.default})",
        )
