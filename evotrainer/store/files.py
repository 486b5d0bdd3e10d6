"""The two small helpers every writer and query shares: crash-safe file writes and SQL string
literals. Written by hand because each is a few lines and the standard library has neither."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def sql_str(s: str) -> str:
    """A SQL string literal (DuckDB and SQLite): single quotes doubled."""
    return "'" + str(s).replace("'", "''") + "'"


def sql_list(values: Iterable[str]) -> str:
    """A parenthesised list of string literals for `IN (...)`; `(NULL)` when empty, which matches nothing."""
    items = [sql_str(v) for v in values]
    return "(" + (", ".join(items) if items else "NULL") + ")"


def fsync_dir(path: str | Path) -> None:
    """Make a rename or a new file inside `path` durable (the directory entry itself is data)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str | Path) -> None:
    """fsync every file under `path`, then each directory: what a ledger row points at is on disk
    before the row commits (a checkpoint directory, a harness file)."""
    path = Path(path)
    if path.is_file():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        fsync_dir(path.parent)
        return
    for d, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(d, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(d)
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Readers see the old file or the whole new one: write a hidden temporary file beside it, fsync,
    rename over, fsync the directory. A killed writer leaves at most a hidden .tmp file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = None) -> Path:
    return atomic_write_bytes(path, json.dumps(obj, indent=indent, default=str).encode())
