"""Errors raised for bad user input.

Every problem a caller can cause has its own ``ValueError`` subclass so that the pipelines
can exit with a message naming it and the service can answer a 4xx naming the field and the
series. ``assert`` is kept for internal invariants only.
"""

from __future__ import annotations


class ForecasterInputError(ValueError):
    """Base class of all user-input errors.

    Attributes:
        series_id: the series the problem was found in, when there is one.
        field: the column or request field at fault, when there is one.
    """

    def __init__(self, message: str, *, series_id: str | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.series_id = series_id
        self.field = field


class InvalidConfigError(ForecasterInputError):
    """A configuration value is out of its allowed range."""


class EmptyDataError(ForecasterInputError):
    """The frame or file holds no rows."""


class MissingColumnsError(ForecasterInputError):
    """Required columns (``unique_id``, ``ds``, ``y`` or a configured covariate) are absent."""


class AmbiguousSeriesIdsError(ForecasterInputError):
    """Two distinct ``unique_id`` values read as one text (``1`` and ``"1"``), so files and
    responses could not tell their series apart."""


class NonNumericValuesError(ForecasterInputError):
    """A target or covariate column holds values that are not numbers."""


class MissingValuesError(ForecasterInputError):
    """A target or covariate column holds NaN or infinite values."""


class InvalidTimestampsError(ForecasterInputError):
    """The ``ds`` column holds values that are not timestamps."""


class DuplicateTimestampsError(ForecasterInputError):
    """A series has the same timestamp twice."""


class SeriesNotContiguousError(ForecasterInputError):
    """A file streamed series by series has a series' rows resume after other series'."""


class IrregularTimestampsError(ForecasterInputError):
    """A series has gaps (or extra points) in what should be a regular frequency."""


class FrequencyInferenceError(ForecasterInputError):
    """No single regular frequency can be inferred from the timestamps."""


class SeriesTooShortError(ForecasterInputError):
    """A series has fewer points than the model needs."""


class UnknownQuantileError(ForecasterInputError):
    """A requested quantile is not one the model was trained for."""


class HorizonTooLongError(ForecasterInputError):
    """The requested horizon exceeds what the model can forecast."""


class MissingCovariatesError(ForecasterInputError):
    """Future values of a known-future covariate are needed but were not given."""


class ModelFileError(ForecasterInputError):
    """A saved model's directory lacks one of its files, holds a damaged one, or holds files
    of two different saves."""


class ModelCodeMismatchError(RuntimeError):
    """A saved model forecasts differently under this code than under the code that saved it
    (its reference forecast does not reproduce): serving it would give other numbers."""


class TrainingDivergedError(RuntimeError):
    """Training reached a non-finite loss or weights: a replayed path (a refit, the tail
    epochs) on this data, or a model that forecasts NaN, which is neither kept nor saved."""
