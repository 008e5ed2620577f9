"""The sample file's on-disk format: schema version, row checksums, the sequence-number reservation block.

Every row carries a CRC-32 of its values (and of the field layout its
features use), so a row changed or torn on disk is recognised at start.
"""

from __future__ import annotations

import json
import sqlite3
import zlib

from routing.features import RAW_FIELDS

SCHEMA_VERSION = 2  # 2: a CRC per row
# Sequence numbers reserved per synced write: one fsync'd transaction per this many samples.
SEQ_BLOCK = 4096


class SampleStoreVersionError(ValueError):
    """The sample file was written by a newer schema than this router reads."""


class CorruptFile(Exception):
    """The sample file is not a readable sample store."""


def layout_crc(fields: list[str]) -> int:
    return zlib.crc32(json.dumps(list(fields)).encode())


def row_crc(row: tuple, layout_crc: int) -> int:
    """CRC-32 of a stored row's ten values (repr is exact for floats and bytes), seeded by its field layout."""
    return zlib.crc32(repr(tuple(row[:10])).encode(), layout_crc)


def add_crcs(db: sqlite3.Connection, fields: list[str]) -> None:
    """Schema 1 -> 2: a CRC column, filled for the rows already there (trusted as they are)."""
    layout = layout_crc(fields)
    with db:
        db.execute("ALTER TABLE samples ADD COLUMN crc INTEGER")
        rows = db.execute("SELECT * FROM samples").fetchall()
        db.executemany("UPDATE samples SET crc = ? WHERE seq = ?", [(row_crc(r, layout), r[0]) for r in rows])
        db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))


CURRENT_LAYOUT_CRC = layout_crc(list(RAW_FIELDS))
