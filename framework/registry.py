"""A small generic name -> object registry (docs/DESIGN.md, "Registries").

The registry name is also the config file name, the `kind:` value and the wandb tag, so a
failed lookup lists what exists and suggests the closest names.
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
    def __init__(self, what: str):
        self.what = what
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise RegistryError(f"{self.what} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        if name not in self._items:
            close = difflib.get_close_matches(name, self._items, n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise RegistryError(
                f"unknown {self.what} {name!r}.{hint} Known: {', '.join(sorted(self._items))}"
            )
        return self._items[name]

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)
