"""Exceptions. Every failure of the tracker or of its input is one of these, with a
message that says what happened and what to do."""


class TrackerError(RuntimeError):
    """Something went wrong with the tracker binary or its output."""


class BinaryNotFoundError(TrackerError, FileNotFoundError):
    """The `resource-tracker` executable could not be found or executed."""


class TrackerDiedError(TrackerError):
    """The tracker process ended before stop() (killed, crashed or refused to start)."""


class SnapshotError(TrackerError, ValueError):
    """A snapshot or dump that is not this package's, is of another version, or is
    truncated."""
