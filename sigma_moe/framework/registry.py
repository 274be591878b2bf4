"""A small generic name -> object registry (docs/DESIGN.md, "Registries").

The registry name is also the config file name, the `kind:` value and the wandb tag, so a
failed lookup lists what exists, suggests the closest names and says how a new one is added
(a config file alone does not register anything).
"""
from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, what: str, how_to_add: str = "", own_config: bool = False,
                 yaml_dir: str = ""):
        self.what = what
        self.how_to_add = how_to_add  # "{name}" is the looked-up name
        self.yaml_dir = yaml_dir  # where the `kind:` lines live (a typo there is the other cause)
        # entries are classes that carry their frozen dataclass as `Cls.Config`: each must
        # set its own (a subclass that forgets reads its parent's keys, silently)
        self.own_config = own_config
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise RegistryError(f"{self.what} {name!r} is registered twice")
            if self.own_config:
                self._check_own_config(name, obj)
            self._items[name] = obj
            return obj

        return deco

    def _check_own_config(self, name: str, cls) -> None:
        if "Config" not in vars(cls):
            parent = next((c.__name__ for c in cls.__mro__[1:] if "Config" in vars(c)), None)
            raise RegistryError(
                f"{self.what} {name!r}: set `Config = <its frozen dataclass>` in class "
                f"{cls.__name__}" + (f" (it would use {parent}'s)" if parent else "")
                + ", even when it adds no field")

    def get(self, name: str) -> T:
        if name not in self._items:
            close = difflib.get_close_matches(name, self._items, n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            typo = (f"; a typo: correct the `kind:` of its yaml in {self.yaml_dir}"
                    if self.yaml_dir else "")
            add = (f" A new one: {self.how_to_add.format(name=name)}{typo}."
                   if self.how_to_add else "")
            raise RegistryError(f"unknown {self.what} {name!r}.{hint} Known: "
                                f"{', '.join(sorted(self._items))}.{add}")
        return self._items[name]

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)
