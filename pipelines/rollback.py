"""Rollback: point `champion` back at the version it replaced."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from mlflow.exceptions import MlflowException

from pipelines import tracking
from pipelines.errors import ModelNotFoundError
from pipelines.promote import PREVIOUS_CHAMPION
from pipelines.registry import CHAMPION, ModelRef, load_version, resolve_model

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RollbackResult:
    model_name: str
    from_version: str | None  # None: there was no champion
    to_version: str


def _current_champion(model_name: str, tracking_uri: str | None) -> ModelRef | None:
    """The champion, or None when the model has versions but none holds the alias."""
    try:
        return resolve_model(f"models:/{model_name}@{CHAMPION}", tracking_uri=tracking_uri)
    except ModelNotFoundError:
        return None


def rollback(
    *, model_name: str, to_version: str | None = None, tracking_uri: str | None = None
) -> RollbackResult:
    """Move ``champion`` to ``to_version``, or by default to the version the current champion
    replaced when it last became champion (its ``promotion.previous_champion`` tag): by a
    promotion, or by a rollback to it by name, which records the version it replaced there,
    so that a plain rollback undoes it. Rolling back twice goes two promotions back. With
    ``to_version``, a model that has lost its champion gets one again. Naming the champion
    itself changes nothing.

    The target must load: a version whose artifacts are gone or damaged (a champion that
    was replaced because it could not be loaded) is refused before the alias moves.

    Raises:
        ModelNotFoundError: no version is named and there is no champion or it replaced
            nothing, or the target version does not exist.
        UnloadableModelError: the target's artifacts cannot be loaded.
    """
    client = tracking.client(tracking_uri)
    named = to_version is not None
    if to_version is not None:
        # Named, the target needs no current champion: this restores one that was lost.
        current = _current_champion(model_name, tracking_uri)
        if current is None:
            target = resolve_model(f"models:/{model_name}/{to_version}", tracking_uri=tracking_uri)
            load_version(target, tracking_uri=tracking_uri, device="cpu")
            with tracking.tracking_errors(tracking_uri):
                client.set_registered_model_alias(model_name, CHAMPION, target.version)
            logger.info("%s@%s: none -> version %s", model_name, CHAMPION, target.version)
            return RollbackResult(model_name, None, target.version)
    else:
        current = resolve_model(f"models:/{model_name}@{CHAMPION}", tracking_uri=tracking_uri)
    with tracking.tracking_errors(tracking_uri):
        if to_version is None:
            tags = client.get_model_version(model_name, current.version).tags
            to_version = tags.get(PREVIOUS_CHAMPION)
            if not to_version:
                raise ModelNotFoundError(
                    f"cannot roll back {model_name}@{CHAMPION}: version {current.version} was the "
                    "first champion (it replaced no version); name one with --to-version",
                    model_uri=f"models:/{model_name}@{CHAMPION}",
                )
        target = resolve_model(f"models:/{model_name}/{to_version}", tracking_uri=tracking_uri)
        if target.version == current.version:
            logger.info(
                "%s@%s is version %s already: nothing changed", model_name, CHAMPION, target.version
            )
            return RollbackResult(model_name, current.version, target.version)
        load_version(target, tracking_uri=tracking_uri, device="cpu")
        try:
            # What a plain rollback goes back to from here, before the alias (as a refit
            # carries it): the target never holds the alias without it.
            if named:
                client.set_model_version_tag(
                    model_name, target.version, PREVIOUS_CHAMPION, current.version
                )
            client.set_registered_model_alias(model_name, CHAMPION, target.version)
        except MlflowException:
            logger.error("rollback of %s failed; champion unchanged", model_name)
            raise
        # The record goes last, after the alias, as a promotion's decision does: a failure in
        # between never leaves a version that says it was rolled back and is still champion.
        client.set_model_version_tag(
            model_name,
            current.version,
            "rollback.rolled_back_at",
            datetime.now(UTC).isoformat(timespec="seconds"),
        )
        client.set_model_version_tag(
            model_name, current.version, "rollback.replaced_by", target.version
        )
    logger.info("%s@%s: version %s -> %s", model_name, CHAMPION, current.version, target.version)
    return RollbackResult(model_name, current.version, target.version)
