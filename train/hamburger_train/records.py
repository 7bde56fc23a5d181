"""The JSON-lines files the stages append to, one record per line. A stage
may be stopped in the middle of a line; readers skip such a line (its record
is made again by the resumed stage)."""

from __future__ import annotations

import json
from pathlib import Path


def read(path: Path) -> list[dict]:
    """Every whole record of `path` (none when it does not exist)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().split("\n"):  # not splitlines(): a record may hold U+2028
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def done_ids(path: Path) -> set[str]:
    """The `id` of every whole record of `path`: the work a resumed stage skips."""
    return {r["id"] for r in read(path) if "id" in r}


def append(path: Path, record: dict) -> None:
    """Appends one whole record (a line) to `path`."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
