"""`--set model.FIELD=VALUE` options of the benchmark commands, parsed once."""

from __future__ import annotations

import argparse
import json
from typing import Any

SECTIONS = ("model", "train")


def _override(item: str) -> tuple[str, str, Any]:
    """ "model.d_model=32" -> ("model", "d_model", 32); values are JSON where they parse, else
    strings (a bare model.loss=mae)."""
    key, _, raw = item.partition("=")
    section, _, name = key.partition(".")
    if section not in SECTIONS or not name:
        raise argparse.ArgumentTypeError(
            f"--set {item}: expected model.FIELD=VALUE or train.FIELD=VALUE"
        )
    try:
        return section, name, json.loads(raw)
    except json.JSONDecodeError:
        return section, name, raw


def add_set_option(parser: argparse.ArgumentParser) -> None:
    """The repeatable `--set model.FIELD=VALUE` option; a malformed item exits with status 2."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        type=_override,
        metavar="model.FIELD=VALUE",
        help="override a ModelConfig/TrainConfig field, e.g. model.d_model=32 or train.max_epochs=5",
    )


def overrides_of(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """{"model": {...}, "train": {...}} from the parsed `--set` items."""
    overrides: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    for section, name, value in args.set:
        overrides[section][name] = value
    return overrides
