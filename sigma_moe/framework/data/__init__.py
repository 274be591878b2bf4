"""Datasets: `DATASETS` maps a config `kind` to a class with `Config` and `load(cfg)`.

Every dataset returns a `TokenData` (1-D token arrays per split + vocab + metric); the
batching (`StreamBatcher`) is shared. Registration by explicit import below.
"""
from sigma_moe.framework.registry import Registry

DATASETS: Registry = Registry(
    "dataset", "decorate its class with @DATASETS.register({name!r}) and import its "
    "module in sigma_moe/framework/data/__init__.py", own_config=True,
    yaml_dir="configs/dataset/")

from sigma_moe.framework.data import (  # noqa: E402,F401  (fill the registry)
    enwik8,
    enwik_mini,
    hf_stream,
    wikitext_mini,
    wt103,
)
from sigma_moe.framework.data.base import DataError, StreamBatcher, TokenData  # noqa: E402

__all__ = ["DATASETS", "DataError", "StreamBatcher", "TokenData"]
