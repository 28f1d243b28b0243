"""The vLLM releases specwake was tested against, named in one place, and values that depend on the release.

A scenario may give a patch or an expectation per release, as a table from a PEP 440 specifier to the value:
`preserve = { "<0.34" = "collapse", ">=0.34" = "recover" }`. `ByRelease` reads such a table (or a plain value, which
holds for every release) and answers for the vLLM a variant's interpreter has. The table must answer every tested
release exactly once, so a gap or an overlap is an input error, not a surprise on a GPU.

Pure: no vLLM import, no file or network access (tests/helpers/releases.py downloads the sources of these releases;
`make releases` asks the registry for the newest).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

# Every release the GPU path is checked against from its sources (tests/e2e/test_releases.py, `make releases`): one per
# series that the `gpu` extra of pyproject.toml allows.
TESTED_RELEASES: tuple[str, ...] = ("0.32.0", "0.33.0", "0.34.0")

T = TypeVar("T")
U = TypeVar("U")


def series(version: str) -> tuple[int, int]:
    """(major, minor) of a version string; ValueError for one that is not PEP 440."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise ValueError(f"{version!r} is not a version") from None
    return parsed.major, parsed.minor


def release_of(version: str) -> str:
    """The release a vLLM version is a build of (0.32.0+cpu → 0.32.0); an unreadable version as it is."""
    try:
        return Version(version).base_version
    except InvalidVersion:
        return version


def is_tested(version: str | None, releases: Sequence[str] = TESTED_RELEASES) -> bool:
    """Whether a vLLM version belongs to the series of one of `releases`, by default the tested ones (0.33.1 and a
    0.33 dev build do; 0.35.0 does not). An unknown or unreadable version is untested."""
    if not version:
        return False
    try:
        return series(version) in {series(r) for r in releases}
    except ValueError:
        return False


def release_at_least(version: str, since: str) -> bool:
    """Whether `version` is of series `since` or later; False for a version that cannot be read."""
    try:
        return series(version) >= series(since)
    except ValueError:
        return False


def tested_span() -> str:
    """The tested releases for a message, e.g. "0.32.0, 0.33.0, 0.34.0"."""
    return ", ".join(TESTED_RELEASES)


def _matches(spec: SpecifierSet, version: str) -> bool:
    """A specifier's answer for a release, dev and pre-releases included (a 0.34 dev build is ">=0.33")."""
    return spec.contains(Version(version).base_version, prereleases=True)


@dataclass(frozen=True)
class ByRelease(Generic[T]):
    """A value that may depend on the vLLM release: `choices` maps specifier text → value; a plain value is stored
    under the empty specifier, which every release matches."""

    choices: tuple[tuple[str, T], ...]

    @classmethod
    def plain(cls, value: T) -> ByRelease[T]:
        return cls((("", value),))

    @classmethod
    def parse(cls, raw: T | Mapping[str, T]) -> ByRelease[T]:
        """From a scenario value: a plain value or a table {specifier: value}. ValueError with a one-line reason
        (the caller adds file and key) for a bad specifier, an empty table, or a table that leaves a tested release
        without a value or gives one two."""
        if not isinstance(raw, Mapping):
            return cls.plain(raw)
        if not raw:
            raise ValueError("an empty table: give a value, or one per release as {'<0.34' = ..., '>=0.34' = ...}")
        for text in raw:
            try:
                SpecifierSet(text)
            except InvalidSpecifier:
                raise ValueError(f"{text!r} is not a release specifier such as '<0.34' or '>=0.32,<0.34'") from None
            if not text.strip():
                raise ValueError("an empty release specifier: a value for every release is written without a table")
        keyed = cls(tuple(raw.items()))
        for release in TESTED_RELEASES:
            hits = [text for text, _ in keyed.choices if _matches(SpecifierSet(text), release)]
            if not hits:
                raise ValueError(f"no value for vLLM {release} (tested releases: {tested_span()})")
            if len(hits) > 1:
                raise ValueError(f"vLLM {release} matches both {hits[0]!r} and {hits[1]!r}")
        return keyed

    def map(self, convert: Callable[[T], U]) -> ByRelease[U]:
        """The same table with each value converted (ValueError from `convert` passes through)."""
        return ByRelease(tuple((text, convert(value)) for text, value in self.choices))

    @property
    def varies(self) -> bool:
        return len({repr(v) for _, v in self.choices}) > 1

    def values(self) -> list[T]:
        return [v for _, v in self.choices]

    def spec_for(self, version: str) -> str | None:
        """The specifier that answers for `version` ("" for a plain value), None when none does."""
        for text, _ in self.choices:
            if not text or _matches(SpecifierSet(text), version):
                return text
        return None

    def for_release(self, version: str | None) -> T | None:
        """The value for `version`; None when no specifier matches it (a release the table does not reach) or the
        version cannot be read while the value depends on it."""
        if not self.varies:
            return self.choices[0][1]
        try:
            Version(version or "")
        except InvalidVersion:
            return None
        text = self.spec_for(version or "")
        return None if text is None else dict(self.choices)[text]

    def per_tested_release(self) -> list[tuple[str, T | None]]:
        """(release, value) for every tested release, for `check`'s text."""
        return [(release, self.for_release(release)) for release in TESTED_RELEASES]

    def to_json(self) -> T | dict[str, T]:
        """As the scenario wrote it."""
        if len(self.choices) == 1 and self.choices[0][0] == "":
            return self.choices[0][1]
        return dict(self.choices)
