"""Typed configs that refuse unknown keys.

zoology's configs accept anything, so a typo in a sweep ("d_modle") silently runs
the default. Every linbench config derives from ``StrictConfig``: construction with
an unknown field, from keywords or from a dict, raises a ValueError that names the
bad field and lists the valid ones. Nested configs are rebuilt from dicts.
"""
from __future__ import annotations

import dataclasses
import typing


class _StrictMeta(type):
    def __call__(cls, *args, **kwargs):
        if dataclasses.is_dataclass(cls):
            _reject_unknown(cls, kwargs)
        return super().__call__(*args, **kwargs)


def _reject_unknown(cls, keys) -> None:
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(keys) - set(valid))
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}; valid fields: {valid}")


class StrictConfig(metaclass=_StrictMeta):
    """Base for dataclass configs (decorate subclasses with ``@dataclass``)."""

    @classmethod
    def from_dict(cls, data: dict):
        _reject_unknown(cls, data)
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for key, value in data.items():
            sub = _strict_type(hints.get(key))
            kwargs[key] = sub.from_dict(value) if sub and isinstance(value, dict) else value
        return cls(**kwargs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes):
        _reject_unknown(type(self), changes)
        return dataclasses.replace(self, **changes)


def _strict_type(hint):
    """The StrictConfig class inside a hint such as ``ModelConfig`` or ``ModelConfig | None``."""
    for cand in (hint, *typing.get_args(hint)):
        if isinstance(cand, type) and issubclass(cand, StrictConfig):
            return cand
    return None


def check_choice(owner: str, field: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{owner}: {field}={value!r} is not valid; choose one of {list(choices)}")
