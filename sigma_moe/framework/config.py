"""Strict conversion of config mappings into each component's frozen dataclass `Config`.

docs/DESIGN.md, "Configs": every component is validated by its dataclass; an unknown or
mistyped key is an error that names the key (and the closest known one).
"""
from __future__ import annotations

import dataclasses
import difflib
import errno
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

C = TypeVar("C")


class ConfigError(ValueError):
    """A user-facing configuration mistake; the message says what to change."""


def check_probability(key: str, p: float) -> None:
    """A dropout probability: 0 <= p < 1 (p = 1 would divide by 1 - p or drop everything)."""
    if not 0 <= p < 1:
        raise ConfigError(f"{key}={p} must be in [0, 1) (a dropout probability)")


# a read-only or full disk, a quota, a permission: the fix is outside the code
ENVIRONMENT_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}


def is_environment_error(e: BaseException) -> bool:
    """An OSError a user fixes outside the code: one line, not a traceback."""
    return isinstance(e, OSError) and e.errno in ENVIRONMENT_ERRNOS


def first_line(e: BaseException) -> str:
    """The first line of an exception's message ("" for none), for a one-line error."""
    return (str(e).strip().splitlines() or [""])[0]


def _check_type(where: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            if arg is type(None) and value is None:
                return None
            try:
                return _check_type(where, value, arg)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where}: {value!r} does not fit {tp}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (arg, *_) = typing.get_args(tp) or (Any,)
        return tuple(_check_type(f"{where}[{i}]", v, arg) for i, v in enumerate(value))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    return value


def did_you_mean(key: object, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' with the known name closest to a mistyped `key`, else ''."""
    close = difflib.get_close_matches(str(key), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def chosen_groups(defaults: Any) -> dict[str, str]:
    """Group -> option of a config file's defaults list (`- override /ffn: dense`,
    `- ffn: dense`); Hydra's own entries (`hydra/launcher`) and `_self_` left out."""
    out = {}
    for item in defaults or []:
        if isinstance(item, dict):
            for key, opt in item.items():
                group = str(key).split()[-1].lstrip("/")
                if "/" not in group and opt is not None:
                    out[group] = str(opt)
    return out


def from_dict(cls: type[C], data: Mapping[str, Any], where: str = "") -> C:
    """Build dataclass `cls` from `data`, refusing unknown keys and wrong types."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            raise ConfigError(f"unknown config key {path!r}{did_you_mean(key, fields)}")
        kwargs[key] = _check_type(path, value, hints[key])
    missing = [n for n, f in fields.items() if n not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:  # TypeError's "missing 1 required positional argument" says not where
        keys = ", ".join(f"{where}.{n}" if where else n for n in missing)
        them = "it" if len(missing) == 1 else "them"
        raise ConfigError(f"{where or cls.__name__}: {cls.__name__} needs {keys}: set {them} "
                          f"in the yaml that configures it or on the command line")
    try:
        return cls(**kwargs)
    except TypeError as e:  # from a __post_init__ (a value of the wrong kind): one line too
        raise ConfigError(f"{where or cls.__name__}: {e}") from None


# The top level of a composed config: the groups, each validated by its component's Config,
# the run's own keys (configs/config.yaml) and an experiment's `paper:` block (its table
# cells, read by scripts/paper_tables.py). Hydra lets a config file add any key: a misspelt
# group in an experiment file (`trainr:`) would be ignored without this check.
TOP_LEVEL = ("task", "dataset", "model", "ffn", "trainer", "logger", "name", "mode", "fresh",
             "sweep_name", "paper")


def check_top_level(cfg: Mapping[str, Any]) -> None:
    for key in cfg:
        if key == "exp":  # without the header, Hydra puts the file's keys under its group
            raise ConfigError(
                f"the keys of experiment {cfg['exp'].get('name', '')!r} ended up under 'exp': "
                "an experiment file must start with the line '# @package _global_'")
        if key not in TOP_LEVEL:
            raise ConfigError(f"unknown config key {key!r} at the top level"
                              f"{did_you_mean(key, TOP_LEVEL)}")
