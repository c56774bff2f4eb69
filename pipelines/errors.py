"""Errors the pipelines raise for problems a user can fix.

Input-data problems are the core's ``ForecasterInputError`` hierarchy; these cover the
registry, the tracking server and the scheduler. The CLI turns every one of them into a
one-line message and a non-zero exit.
"""

from __future__ import annotations


class ModelNotFoundError(ValueError):
    """A registered model, version or alias does not exist.

    Attributes:
        model_uri: the ``models:/NAME@alias`` or ``models:/NAME/VERSION`` that was asked for.
    """

    def __init__(self, message: str, *, model_uri: str):
        super().__init__(message)
        self.model_uri = model_uri


class UnloadableModelError(ModelNotFoundError):
    """A registered version exists but its artifacts cannot be loaded (corrupt, incomplete, or
    saved by code that forecasts differently): for every use, it is not there."""


class InvalidModelUriError(ValueError):
    """A model URI is not ``models:/NAME@alias`` or ``models:/NAME/VERSION``."""


class NoChallengerError(ModelNotFoundError):
    """Promotion was asked for but no version carries the ``challenger`` alias."""


class TrackingUnavailableError(ConnectionError):
    """The MLflow tracking server or registry cannot be reached."""


class PipelineLockedError(RuntimeError):
    """Another pipeline run holds the lock; two runs must never overlap."""
