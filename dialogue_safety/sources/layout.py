"""Where a source's files sit under a data directory, and whether what is there is complete.

Each loader module has a ``find(data_dir) -> SourceFiles`` that tries the documented folder
and file names (the official download layout and the layout of the shared data directory) and
reports what it found; the registry turns that into :class:`~dialogue_safety.sources.registry.SourceInfo`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from dialogue_safety.core.schema import LabelledExample, Split


class Status(StrEnum):
    COMPLETE = "complete"  # the official files, every split
    PARTIAL = "partial"  # real data, but some splits or rows are missing
    SAMPLE = "sample-only"  # format samples or fixtures: never train or evaluate on them
    MISSING = "missing"


@dataclass(frozen=True)
class SourceFiles:
    """What ``find`` located: files by role (``"train"``, ``"test_labels"``, ...), a status, a note."""

    status: Status
    files: Mapping[str, Path] = field(default_factory=dict)
    note: str = ""

    @classmethod
    def missing(cls, note: str = "") -> SourceFiles:
        return cls(Status.MISSING, {}, note)


def existing_dirs(data_dir: Path, names: Iterable[str]) -> list[Path]:
    """The folders among ``data_dir/name`` that exist, in the order given."""
    return [data_dir / name for name in names if (data_dir / name).is_dir()]


def find_file(dirs: Iterable[Path], names: Iterable[str]) -> Path | None:
    """The first ``dir/name`` or ``dir/name.gz`` that is a file, trying every name in each dir."""
    wanted = list(names)
    for folder in dirs:
        for name in wanted:
            for candidate in (folder / name, folder / f"{name}.gz"):
                if candidate.is_file():
                    return candidate
    return None


def find_files(dirs: Iterable[Path], roles: Mapping[str, Iterable[str]]) -> dict[str, Path]:
    """For each role, the first matching file in the first folder that has any role's file."""
    for folder in dirs:
        found = {role: path for role, names in roles.items() if (path := find_file([folder], names))}
        if found:
            return found
    return {}


def split_status(found: Mapping[str, Path], expected: Iterable[str]) -> tuple[Status, str]:
    """COMPLETE when every expected role was found, else PARTIAL with a note naming the gaps."""
    missing = [role for role in expected if role not in found]
    if not found:
        return Status.MISSING, ""
    if missing:
        return Status.PARTIAL, f"missing {', '.join(missing)}"
    return Status.COMPLETE, ""


def read_split_files(
    found: SourceFiles,
    splits: frozenset[Split],
    split_of: Mapping[str, Split],
    read_file: Callable[[Path, Split], Iterable[LabelledExample]],
) -> Iterator[LabelledExample]:
    """Read each found per-split file (role → split via ``split_of``) whose split is wanted."""
    for role, path in found.files.items():
        if split_of[role] in splits:
            yield from read_file(path, split_of[role])


def part_of(found: SourceFiles, prefix: str) -> SourceFiles:
    """The files of one input of a derived source (roles ``"<prefix>/<role>"``) as that input's own."""
    files = {k.split("/", 1)[1]: v for k, v in found.files.items() if k.startswith(prefix + "/")}
    return SourceFiles(Status.COMPLETE if files else Status.MISSING, files)


def derived_from(parts: Mapping[str, SourceFiles]) -> SourceFiles:
    """A derived source's files from its inputs' (roles ``"<input>/<role>"``): complete when every
    input is there, partial when some are, missing when none is."""
    files = {f"{name}/{role}": path for name, found in parts.items() for role, path in found.files.items()}
    names = ", ".join(parts)
    if not files:
        return SourceFiles.missing(f"derived: needs {names}")
    missing = [name for name, f in parts.items() if f.status is Status.MISSING]
    note = f"derived; missing: {', '.join(missing)}" if missing else f"derived from {names}"
    return SourceFiles(Status.PARTIAL if missing else Status.COMPLETE, files, note)


def load_parts(
    found: SourceFiles,
    loaders: Mapping[str, Callable[[SourceFiles, frozenset[Split]], Iterable[LabelledExample]]],
    splits: frozenset[Split],
) -> list[LabelledExample]:
    """The rows of every input of a derived source that is there (``loaders``: input → its load), of the
    wanted ``splits`` among TRAIN and VALID (a derived source has no TEST split)."""
    wanted = frozenset({Split.TRAIN, Split.VALID}) & splits
    rows: list[LabelledExample] = []
    for name, load in loaders.items():
        part = part_of(found, name)
        if part.files:
            rows += load(part, wanted)
    return rows
