"""The two ways reading a dataset can fail: a malformed file, or a source that is not there."""

from __future__ import annotations

from pathlib import Path


class DatasetFormatError(ValueError):
    """A dataset file does not match its documented format.

    The message always names the file, where in it (``path:LINE:`` for CSV and line-based
    files, counting the header as line 1 and using the physical line a CSV record starts on;
    ``path at a.b[3]:`` for a record inside a JSON document) and the problem, e.g.
    ``.../train.csv:17: unknown label 'maybe' in column label_gold (expected 0 or 1)``.
    """

    def __init__(self, path: str | Path, problem: str, *, line: int | None = None, where: str | None = None):
        self.path = Path(path)
        self.problem = problem
        self.line = line
        self.where = where
        if line is not None:
            location = f"{self.path}:{line}"
        elif where:
            location = f"{self.path} at {where}"
        else:
            location = str(self.path)
        super().__init__(f"{location}: {problem}")


class SourceUnavailableError(FileNotFoundError):
    """A source's files are missing under the data directory, or only samples are present."""
