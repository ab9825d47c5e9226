""".dockerignore read as the container builders read it, without a container engine.

The rules are those of moby's patternmatcher, which both docker (BuildKit) and podman
(buildah, through containers/storage's fileutils) follow:

- a pattern is matched against the path relative to the context's root, cleaned, with
  any leading ``/`` dropped; ``!`` in front of a pattern lets back in what it matches;
- ``*`` is any run of characters but ``/``, ``?`` one such character, ``**`` any number
  of folders (``**/`` zero or more), ``\\`` escapes the next character;
- a pattern that matches a folder matches everything under it;
- patterns are read in order and the last one that matches a path decides.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pattern:
    text: str
    exclusion: bool  # a "!" pattern: lets back in what it matches
    regex: re.Pattern

    def matches(self, path: str) -> bool:
        """``path`` or one of its parent folders matches (patternmatcher's MatchesOrParentMatches)."""
        if self.regex.match(path):
            return True
        parts = path.split("/")[:-1]
        return any(self.regex.match("/".join(parts[: i + 1])) for i in range(len(parts)))


def compile_pattern(text: str) -> re.Pattern:
    """patternmatcher's Pattern.compile, for '/' as the separator."""
    out, i = "^", 0
    while i < len(text):
        ch = text[i]
        if ch == "*":
            if text[i + 1 : i + 2] == "*":
                i += 1
                if text[i + 1 : i + 2] == "/":
                    i += 1
                out += ".*" if i + 1 >= len(text) else "(.*/)?"
            else:
                out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "\\" and i + 1 < len(text):
            i += 1
            out += re.escape(text[i])
        else:
            out += re.escape(ch)
        i += 1
    return re.compile(out + "$")


def read_patterns(dockerignore: Path) -> list[Pattern]:
    patterns = []
    for raw in dockerignore.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclusion = line.startswith("!")
        if exclusion:
            line = line[1:].strip()
        cleaned = os.path.normpath(line).lstrip("/")
        if cleaned == ".":
            continue
        patterns.append(Pattern(cleaned, exclusion, compile_pattern(cleaned)))
    return patterns


def excluded(path: str, patterns: list[Pattern]) -> bool:
    """Whether the build leaves ``path`` (relative to the context's root) out."""
    out = False
    for pattern in patterns:
        if pattern.matches(path):
            out = not pattern.exclusion
    return out


def build_context(root: Path, files: list[str]) -> set[str]:
    """Of ``files`` (relative to ``root``), those the build context holds."""
    dockerignore = root / ".dockerignore"
    patterns = read_patterns(dockerignore) if dockerignore.exists() else []
    return {f for f in files if not excluded(f, patterns)}
