"""Typed configs that refuse unknown keys, wrong types and out-of-range values.

zoology's configs accept anything, so a typo in a sweep ("d_modle") silently runs
the default. Every linbench config derives from ``StrictConfig``: construction with
an unknown field, from keywords or from a dict, raises a ValueError that names the
bad field and lists the valid ones. Each given value is checked against its field's
type hint before the dataclass runs (``steps="300"`` names ``steps`` instead of failing
in a comparison), and each config's ``__post_init__`` states its ranges with
``check_bounds``. Nested configs are rebuilt from dicts.

A sweep file builds its configs at import, so the first bad one would hide the rest:
under ``collecting()`` a config that cannot be built is returned as an ``InvalidConfig``
carrying the error, and the sweep loader reports every one of them at once.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import re
import types
import typing


class _StrictMeta(type):
    def __call__(cls, *args, **kwargs):
        if not dataclasses.is_dataclass(cls):
            return super().__call__(*args, **kwargs)

        def build():
            _reject_unknown(cls, kwargs)
            names = [f.name for f in dataclasses.fields(cls) if f.init]
            reasons: list[str] = []  # every bad field, named at once

            def checked(name, value):
                try:
                    return _checked(cls, name, value)
                except ValueError as exc:
                    reasons.append(_reason(cls, exc))
                    return value  # as given: the value checks below may name more fields

            # positional values are checked by the name they bind to; extra ones are
            # left for the dataclass to refuse
            checked_args = [checked(name, value) for name, value in zip(names, args)] + list(args[len(names):])
            checked_kwargs = {name: checked(name, value) for name, value in kwargs.items()}
            token = _reasons_found.set([])
            try:
                config = type.__call__(cls, *checked_args, **checked_kwargs)
            except Exception:
                if not (reasons or _reasons_found.get()):
                    raise
                config = None  # a check already said what is wrong; what failed after it follows from it
            finally:
                found = _reasons_found.get()
                _reasons_found.reset(token)
            reasons = _one_per_field(reasons + found)
            if reasons:
                raise ValueError(f"{cls.__name__}: {'; '.join(reasons)}")
            return config

        return _guarded(cls, build)


# Inside a config's construction, the value checks collect what they find here instead of
# raising at the first, so that one error names every bad field.
_reasons_found: contextvars.ContextVar[list | None] = contextvars.ContextVar("linbench_problems", default=None)


def _refuse(owner: str, reason: str) -> None:
    found = _reasons_found.get()
    if found is None:
        raise ValueError(f"{owner}: {reason}")
    found.append(reason)


def _one_per_field(reasons: list[str]) -> list[str]:
    """The first reason given for each field ("lr=nan must be finite" before "lr=nan must
    be > 0")."""
    seen, out = set(), []
    for reason in reasons:
        field = re.match(r"[A-Za-z_][\w.]*", reason)
        key = field.group(0) if field else reason
        if key not in seen:
            seen.add(key)
            out.append(reason)
    return out


def _reject_unknown(cls, keys) -> None:
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(keys) - set(valid))
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}; valid fields: {valid}")


class StrictConfig(metaclass=_StrictMeta):
    """Base for dataclass configs (decorate subclasses with ``@dataclass``)."""

    @classmethod
    def from_dict(cls, data: dict):
        """The config a dict (a record's) describes; a field that replaced another
        (``renamed_from``) reads the old name's value where the dict has only that."""
        data = dict(data)
        for f in dataclasses.fields(cls):
            was = f.metadata.get("was")
            if was and was[0] in data and f.name not in data:
                old, readings = was
                value = data.pop(old)
                if value not in readings:
                    raise ValueError(f"{cls.__name__}: {old}={value!r} (now {f.name}) has no reading; "
                                     f"readable: {list(readings)}")
                data[f.name] = readings[value]
        # construction itself rebuilds nested configs from dicts and checks every value
        return cls(**data)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes):
        def build():
            _reject_unknown(type(self), changes)
            return dataclasses.replace(self, **changes)  # constructs anew: every check runs

        return _guarded(type(self), build)


# --- how a field enters a run's identity -----------------------------------------
# A run id is a hash of the run's config (sweeps.spec.identity); a field says here, where
# it is declared, if it is hashed otherwise than as itself. Adding a field with a default
# moves every committed run id unless the field says WHEN_SET.

NOT_IN_ID = {"identity": "omit"}  # never changes a result: where files live, cadences, process layout
WHEN_SET = {"identity": "when_set"}  # added after records were made under its default: hashed only when set


def id_as(rule) -> dict:
    """Metadata for a field hashed as ``rule(value)``, a dict of what it hashes as ({}: nothing)."""
    return {"identity": rule}


def renamed_from(old: str, readings: dict) -> dict:
    """Metadata for a field that replaced ``old``: a record that still has ``old`` reads its
    value through ``readings`` (``StrictConfig.from_dict``)."""
    return {"was": (old, readings)}


# --- collecting every error of a sweep file --------------------------------------

_collecting: contextvars.ContextVar[bool] = contextvars.ContextVar("linbench_collecting", default=False)


@contextlib.contextmanager
def collecting(enabled: bool = True):
    """Inside, building an invalid StrictConfig returns an ``InvalidConfig`` instead of
    raising, so that loading a sweep file can report all its bad configs, not the first.
    ``collecting(False)`` restores raising, for code that catches the error itself."""
    token = _collecting.set(enabled)
    try:
        yield
    finally:
        _collecting.reset(token)


class InvalidConfigError(ValueError):
    """An ``InvalidConfig`` was used as if it were a config."""


class InvalidConfig:
    """Stands in for a config that could not be built under ``collecting()``. ``error``
    is what construction would have raised, e.g. ``TrainConfig: warmup_steps=-10 must
    be >= 0``. A config given it as a nested field is invalid in turn; using any of its
    fields raises InvalidConfigError, since there are none."""

    def __init__(self, cls: type, reason: str):
        self.cls = cls
        self.reason = reason  # the error without the leading "ClassName: "

    @property
    def error(self) -> str:
        return f"{self.cls.__name__}: {self.reason}"

    def replace(self, **changes):
        return self  # a variant of an invalid config is as invalid (e.g. one per seed)

    def __getattr__(self, name):
        if name.startswith("__"):  # copy, pickle and friends probe dunders: say "none"
            raise AttributeError(name)
        raise InvalidConfigError(f"{name!r} of an invalid config: {self.error}")

    def __repr__(self) -> str:
        return f"InvalidConfig({self.error!r})"


def _reason(cls: type, exc: Exception) -> str:
    """The message of ``exc`` without the ``ClassName: `` our errors start with."""
    text = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
    prefix = f"{cls.__name__}: "
    return text[len(prefix):] if text.startswith(prefix) else text


def _guarded(cls: type, build):
    if not _collecting.get():
        return build()
    try:
        return build()
    except Exception as exc:  # any failure to build is this config's error, reported later
        return InvalidConfig(cls, _reason(cls, exc))


# --- type checks from the hints ----------------------------------------------------

_HINTS: dict[type, dict] = {}


def _hints(cls) -> dict:
    if cls not in _HINTS:  # resolving string annotations is slow; configs are built often
        try:
            _HINTS[cls] = typing.get_type_hints(cls)
        except Exception:  # a hint that does not resolve (e.g. a local class): no checks
            _HINTS[cls] = {}
    return _HINTS[cls]


def _checked(cls, name: str, value):
    """``value`` for field ``name`` of ``cls``, converted where the conversion is lossless
    (a dict into a nested config, a list into a tuple: what a JSON record holds), or a
    ValueError naming the field."""
    hint = _hints(cls).get(name)
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if value is None and len(rest) < len(args):
            return None
        if len(rest) != 1:
            return value  # a union of several types: not checked
        hint = rest[0]
    origin = typing.get_origin(hint) or hint  # tuple[int, ...] -> tuple
    own = cls.__name__
    if isinstance(origin, type) and issubclass(origin, StrictConfig):
        if isinstance(value, dict):
            try:
                value = hint.from_dict(value)  # under collecting(): an InvalidConfig, handled below
            except Exception as exc:
                raise ValueError(f"{own}: {name}: {_reason(hint, exc)}") from exc
        if isinstance(value, InvalidConfig):
            raise ValueError(f"{own}: {name}: {value.reason}")
        if not isinstance(value, hint):
            raise ValueError(f"{own}: {name} must be a {hint.__name__} or a dict, got {type(value).__name__}")
        return value
    if origin is bool:
        ok = isinstance(value, bool)
    elif origin is int:
        ok = isinstance(value, int) and not isinstance(value, bool)  # True is an int to Python
    elif origin is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and not math.isfinite(value):
            raise ValueError(f"{own}: {name}={value!r} must be finite")
    elif origin is tuple:
        if isinstance(value, list):
            value = tuple(value)
        ok = isinstance(value, tuple)
    elif origin in (str, list, dict):
        ok = isinstance(value, origin)
    else:
        return value  # Any, callables, other classes: not checked
    if not ok:
        kind = {int: "an int", float: "a float", bool: "a bool"}.get(origin, f"a {origin.__name__}")
        raise ValueError(f"{own}: {name}={value!r} must be {kind}")
    return value


# --- value checks ------------------------------------------------------------------

def check_choice(owner: str, field: str, value, choices) -> None:
    if value not in choices:
        _refuse(owner, f"{field}={value!r} is not valid; choose one of {list(choices)}")


def check_bounds(config, *names: str, gt=None, ge=None, le=None, lt=None) -> None:
    """Each named field of ``config`` must satisfy the bounds; None values (optional
    fields left unset) pass. ``check_bounds(self, "warmup_steps", ge=0)`` raises
    ``TrainConfig: warmup_steps=-10 must be >= 0``."""
    tests = [(">", gt, lambda v, b: v > b), (">=", ge, lambda v, b: v >= b),
             ("<=", le, lambda v, b: v <= b), ("<", lt, lambda v, b: v < b)]
    for name in names:
        value = getattr(config, name)
        if value is None:
            continue
        for op, bound, holds in tests:
            try:
                fine = bound is None or holds(value, bound)
            except TypeError:  # a value of the wrong type: its type check has said so
                break
            if not fine:
                _refuse(type(config).__name__, f"{name}={value!r} must be {op} {bound}")
                break  # one reason per field
