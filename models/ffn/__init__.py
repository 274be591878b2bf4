"""Feedforward variants, one per file; `FFNS` maps the config `kind` to the module class.

Each class carries its frozen dataclass as `Cls.Config`. Registration happens by the
explicit imports below (docs/DESIGN.md: no scanning).
"""
from framework.registry import Registry, RegistryError


def _own_config(name: str, cls: type) -> None:
    """A subclass that forgets `Config = ...` would read its parent's keys and get its
    parent's FLOPs formula (models/flops.py), silently."""
    if "Config" not in vars(cls):
        parent = next((c.__name__ for c in cls.__mro__[1:] if "Config" in vars(c)), None)
        raise RegistryError(
            f"ffn variant {name!r}: set `Config = <its frozen dataclass>` in class "
            f"{cls.__name__}" + (f" (it would use {parent}'s)" if parent else "")
            + ", even when it adds no field")


FFNS: Registry = Registry(
    "ffn variant", "decorate its class with @FFNS.register({name!r}) and import its "
    "module in models/ffn/__init__.py", check=_own_config)

# fill the registry
from models.ffn import dense, pkm, sbase, sigma_moe, switch, topk  # noqa: E402,F401
from models.ffn.base import FFN  # noqa: E402

__all__ = ["FFNS", "FFN"]
