"""Salvage of a damaged sample file: every row a sequence-ordered scan can still read.

A read that fails skips ahead to where the table reads again; numbering
after a salvage resumes SEQ_BLOCK past anything known, since the file's own
high-water mark may be among the lost pages.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from routing.features import RAW_FIELDS
from routing.samples.format import SCHEMA_VERSION, SEQ_BLOCK, SampleStoreVersionError


@dataclass
class Salvage:
    rows: list[tuple]  # stored rows, CRC last (None: written before schema 2)
    fields: list[str]
    counters: dict
    next_seq: int
    stretches: int  # unreadable stretches skipped


def salvage_file(path: Path) -> Salvage:
    """What can still be read from a damaged sample file: rows in seq order, its meta where readable.

    Raises SampleStoreVersionError if the meta says a newer schema wrote it.
    """
    empty = Salvage([], list(RAW_FIELDS), {}, 1, 0)
    try:
        db = sqlite3.connect(path)
    except sqlite3.Error:
        return empty
    try:
        try:
            meta = dict(db.execute("SELECT key, value FROM meta"))
        except sqlite3.Error:
            meta = {}
        try:
            version = int(meta.get("schema_version", "0"))
        except ValueError:
            version = 0
        if version > SCHEMA_VERSION:
            raise SampleStoreVersionError(f"sample store {path}: schema_version {version} is newer than this "
                                          f"router's {SCHEMA_VERSION}; use a newer router or another samples.path")
        try:
            fields = json.loads(meta["raw_fields"])
            if not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
                raise TypeError
        except (KeyError, ValueError, TypeError):
            fields = list(RAW_FIELDS)  # rows in another layout then fail their CRC instead of being misread
        counters, known = {}, [1]
        try:
            counters = json.loads(meta.get("counters", "{}"))
            known += [int(counters.get("next_seq", 1)), int(meta.get("seq_reserved", 0))]
        except (ValueError, TypeError, AttributeError):
            counters = {}
        try:
            has_table = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'samples'").fetchone() is not None
        except sqlite3.Error:
            has_table = True  # the schema page itself may be what is damaged: try anyway
        if not has_table:
            return empty
        rows, stretches = _readable_rows(db)
    finally:
        db.close()
    rows = [tuple(r) + (None,) * (11 - len(r)) for r in rows if len(r) in (10, 11) and isinstance(r[0], int)]
    if rows:
        known.append(rows[-1][0] + 1)
    next_seq = max(known) + SEQ_BLOCK if max(known) > 1 else 1
    counters = {"next_seq": next_seq, "added_total": int(counters.get("added_total", len(rows))),
                "evicted_total": int(counters.get("evicted_total", 0))}
    return Salvage(rows, fields, counters, counters["next_seq"], stretches)


def _readable_rows(db: sqlite3.Connection) -> tuple[list[tuple], int]:
    """Every row a seq-ordered scan can read, and how many unreadable stretches it skipped."""
    rows: list[tuple] = []
    stretches, last, resumed = 0, 0, None
    while True:
        try:
            for row in db.execute("SELECT * FROM samples WHERE seq > ? ORDER BY seq", (last,)):
                rows.append(row)
                last = row[0]
            return rows, stretches
        except sqlite3.Error:
            if last != resumed:  # a failure right where the last skip landed is the same stretch
                stretches += 1
            resume = _next_readable(db, last + 2)
            if resume is None:
                return rows, stretches
            last = resumed = resume - 1


def _next_readable(db: sqlite3.Connection, lo: int, *, upper: int = 2**62) -> int | None:
    """Smallest seq >= lo from which a seek into the table reads again (None: nothing up to `upper`).

    Doubling steps find a readable point past the damage, then bisection narrows
    it down, so a damaged page costs about 2 log2(rows it spans) seeks.
    """
    def readable(x: int) -> bool:
        try:
            db.execute("SELECT seq FROM samples WHERE seq >= ? ORDER BY seq LIMIT 1", (x,)).fetchall()
            return True
        except sqlite3.Error:
            return False

    bad, x, step = lo - 1, lo, 1
    while not readable(x):
        bad = x
        if x > upper:
            return None
        x, step = lo + step, step * 2
    while x - bad > 1:
        mid = (bad + x) // 2
        if readable(mid):
            x = mid
        else:
            bad = mid
    return x
