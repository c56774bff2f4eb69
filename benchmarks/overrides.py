"""`--set model.FIELD=VALUE` options of the benchmark commands, parsed once."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_set_option(parser: argparse.ArgumentParser) -> None:
    """The repeatable `--set model.FIELD=VALUE` option."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="model.FIELD=VALUE",
        help="override a ModelConfig/TrainConfig field, e.g. model.d_model=32 or train.max_epochs=5",
    )


def parse_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """{"model": {...}, "train": {...}}; values are JSON where they parse, else strings.

    Raises:
        ValueError: an item is not model.FIELD=VALUE or train.FIELD=VALUE.
    """
    overrides: dict[str, dict[str, Any]] = {"model": {}, "train": {}}
    for item in items:
        key, _, raw = item.partition("=")
        section, _, name = key.partition(".")
        if section not in overrides or not name:
            raise ValueError(f"--set {item}: expected model.FIELD=VALUE or train.FIELD=VALUE")
        try:
            overrides[section][name] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[section][name] = raw  # a bare string such as model.loss=mae
    return overrides
