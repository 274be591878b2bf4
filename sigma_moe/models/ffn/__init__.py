"""Feedforward variants, one per file; `FFNS` maps the config `kind` to the module class.

Each class carries its frozen dataclass as `Cls.Config`. Registration happens by the
explicit imports below (docs/DESIGN.md: no scanning).
"""
from sigma_moe.framework.registry import Registry

# (a variant that forgot its own Config would also get its parent's FLOPs formula,
# sigma_moe/models/flops.py)
FFNS: Registry = Registry(
    "ffn variant", "decorate its class with @FFNS.register({name!r}) and import its "
    "module in sigma_moe/models/ffn/__init__.py", own_config=True, yaml_dir="configs/ffn/")

# fill the registry
from sigma_moe.models.ffn import dense, pkm, sbase, sigma_moe, switch, topk  # noqa: E402,F401
from sigma_moe.models.ffn.base import FFN  # noqa: E402

__all__ = ["FFNS", "FFN"]
