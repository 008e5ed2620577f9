"""The sample store's SQLite mirror: batched writes, durable sequence numbers, recovery at start.

Persistence (optional, `path`): a SQLite file (stdlib sqlite3, WAL journal)
mirrors the store. Added rows are written in batches: at most
`flush_interval_s` (1 s) after the first unwritten one, or at once when
`flush_rows` (256) are waiting, and on `close()`. Each batch is one
transaction holding the new rows, the rows they evicted and the counters (next
sequence number, added and evicted totals), so the file always holds a state
the store was in (a sample evicted before it was written is never written).
A killed process loses at most the last second of samples; synchronous mode
NORMAL: a power failure may lose the last transactions but never corrupts the
file. One write per sample cost ~150 us on this machine, a batch ~10 us a row. At start the rows are read back in
sequence order through the same bounded insertion (a smaller capacity evicts
by bucket, and those rows leave the file too), and sequence numbers continue
where they stopped, so a reader's cursor stays valid across restarts.

One writer per file: the store holds an exclusive lock on `<name>.lock`
(routing.store_guard) from open to close, so a second router on the same file
is refused at start naming the holder's pid instead of interleaving writes.

Sequence numbers never repeat, even across a crash: before handing out a
number at or past the durable high-water mark (`seq_reserved` in the meta
table) the store raises the mark by SEQ_BLOCK in its own synced transaction,
and at start numbering resumes at the mark. A killed process leaves a gap of
at most SEQ_BLOCK numbers; close() gives back the unused part, so a clean
restart leaves none.

Every row carries a CRC-32 of its values (and of the field layout its
features use). A row whose CRC does not match, or that is malformed, is
quarantined at start: appended to `<name>.quarantine-<UTC time>.jsonl`,
removed from the store, counted in a warning. A file SQLite itself finds
damaged (`quick_check` fails, a read errors, tables missing) is renamed to
`<name>.corrupt-<UTC time>` (kept for inspection, never deleted); the rows
still readable in it are salvaged in sequence order (a read that fails skips
ahead to where the table reads again), checked the same way, and carried into
a fresh file, and the warning names both files and the counts. Numbering
after a salvage resumes SEQ_BLOCK past anything known, since the file's own
high-water mark may be among the lost pages. A file written by a newer schema
is refused (ValueError naming the file): a downgrade must not discard it.
Stored features are kept by name; rows lacking a field the current feature
set needs (written before a feature-set change) are not loaded and are
counted in the warning.

A write that fails (a full disk) keeps the unwritten samples in memory and
retries every `flush_interval_s` until it goes through; the file stays as the
last good transaction left it. Routing never waits on the file: the failure is
logged and counted in stats() (`persist_errors_total`, `pending_writes`).
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
import time

import numpy as np

from routing.features import RAW_FIELDS, ROLE_CODE, TARGETS
from routing.fleet.lifecycle import Sample
from routing.samples.format import (
    CURRENT_LAYOUT_CRC,
    SCHEMA_VERSION,
    SEQ_BLOCK,
    CorruptFile,
    SampleStoreVersionError,
    add_crcs,
    layout_crc,
    row_crc,
)
from routing.samples.salvage import Salvage, salvage_file
from routing.store_guard import is_full

log = logging.getLogger(__name__)


class SampleFile:
    """Persistence methods of routing.samples.store.SampleStore (a mixin: they read and write the store's state).

    Called with the store's lock held, except `_open` (from the constructor, before the store is shared).
    """

    def _queue(self, seq: int, row: list, sample: Sample) -> None:
        n = len(RAW_FIELDS)
        # + 0.0 turns -0.0 into 0.0, which is what SQLite gives back (the CRC must match on reading).
        predicted = None if sample.predicted_ms is None else float(sample.predicted_ms) + 0.0
        values = (seq, sample.target, sample.request_id, sample.endpoint_id, sample.role,
                  np.asarray(row[:n], dtype="<f8").tobytes(), float(row[n]) + 0.0, predicted,
                  sample.model_version, float(row[n + 2]) + 0.0)
        self._pending[seq] = values + (row_crc(values, CURRENT_LAYOUT_CRC),)
        for q in self._evicted_seqs:
            if self._pending.pop(q, None) is None:  # evicted before it was written: nothing to delete
                self._deletes.append(q)
        if len(self._pending) + len(self._deletes) >= self.flush_rows and not self._failing:
            self._flush()
        elif self._timer is None:
            self._start_timer()

    def _start_timer(self) -> None:
        self._timer = threading.Timer(self.flush_interval_s, self.flush)
        self._timer.daemon = True
        self._timer.start()

    def _flush(self, *, counters: bool = False) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._db is None or not (self._pending or self._deletes or counters):
            return
        try:
            with self._db:  # one transaction: new rows, what they evicted, the counters
                self._db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                     list(self._pending.values()))
                self._db.executemany("DELETE FROM samples WHERE seq = ?", [(q,) for q in self._deletes])
                self._write_counters()
        except sqlite3.Error as exc:
            # The transaction rolled back: the file is as the last good batch left
            # it. The samples stay queued (and in memory, so routing goes on) and
            # the timer tries again; row counts no longer trigger writes meanwhile.
            self._persist_failed(exc, f"writing {len(self._pending)} samples")
            self._failing = True
            if self._pending or self._deletes:
                self._start_timer()
            return
        if self._failing:
            log.warning("sample store %s: writing works again (%d samples written after %d failed writes)",
                        self.path, len(self._pending), self.persist_errors_total)
            self._failing = False
        self._pending.clear()
        self._deletes.clear()

    def _reserve(self, upto: int) -> None:
        """Durably raise the sequence high-water mark to `upto` before numbers below it are handed out."""
        self._seq_reserved = upto  # a failed write is retried with the next batch's counters
        try:
            self._db.execute("PRAGMA synchronous=FULL")  # this one commit survives a power cut too
            try:
                with self._db:
                    self._db.execute("INSERT OR REPLACE INTO meta VALUES ('seq_reserved', ?)", (str(upto),))
            finally:
                self._db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            self._persist_failed(exc, f"reserving sequence numbers up to {upto}")

    def _persist_failed(self, exc: sqlite3.Error, doing: str) -> None:
        self.persist_errors_total += 1
        if self.persist_errors_total == 1 or self.persist_errors_total % 100 == 0:
            cause = "disk full" if is_full(exc) else "write failed"
            log.error("sample store %s: %s %s (%s); kept in memory and retried every %g s; %d failed writes so far",
                      self.path, cause, doing, exc, self.flush_interval_s, self.persist_errors_total)

    def _write_counters(self) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO meta VALUES ('counters', ?)",
            (json.dumps({"next_seq": self._next_seq, "added_total": self.added_total,
                         "evicted_total": self.evicted_total}),),
        )
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('seq_reserved', ?)", (str(self._seq_reserved),))

    def _open(self) -> None:
        try:
            self._open_file()
        except sqlite3.Error as exc:
            if not is_full(exc):
                raise
            raise ValueError(f"sample store {self.path}: disk full while opening it ({exc}); "
                             "free space or point samples.path elsewhere") from None

    def _open_file(self) -> None:
        try:
            self._db, rows, fields, skipped, bad = self._read_file()
        except CorruptFile as exc:
            salvage = salvage_file(self.path)  # a file from a newer schema raises here and stays in place
            stamp = time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
            self.path.rename(aside)
            for suffix in ("-wal", "-shm"):
                side = self.path.with_name(self.path.name + suffix)
                if side.exists():
                    side.rename(aside.with_name(aside.name + suffix))
            if salvage.rows or salvage.next_seq > 1:
                self._write_salvage(salvage)
            self._db, rows, fields, skipped, bad = self._read_file()
            log.warning("sample store %s is unreadable (%s): moved to %s; %d rows salvaged from it "
                        "(%d unreadable stretches skipped), numbering resumes at %d", self.path, exc, aside,
                        len(salvage.rows), salvage.stretches, self._next_seq)
        self._quarantine(bad)
        if skipped:
            log.warning("sample store %s: %d stored samples lack current feature fields (feature set changed); "
                        "not loaded and removed", self.path, skipped)
        self._load(rows, fields)

    def _read_file(self):
        """(connection, good rows in seq order, stored field names, rows skipped, (row, reason) failing
        their CRC) or CorruptFile."""
        try:
            # `with db:` commits a transaction (or rolls it back on an error).
            db = sqlite3.connect(self.path, check_same_thread=False)
        except sqlite3.Error as exc:
            raise CorruptFile(str(exc)) from exc
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise CorruptFile(f"quick_check: {check}")
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                with db:
                    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                    db.execute(
                        "CREATE TABLE samples (seq INTEGER PRIMARY KEY, target TEXT NOT NULL, request_id TEXT, "
                        "endpoint_id TEXT, role TEXT NOT NULL, features BLOB NOT NULL, observed_ms REAL NOT NULL, "
                        "predicted_ms REAL, model_version TEXT, recorded_at_s REAL NOT NULL, crc INTEGER)"
                    )
                    db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                    db.execute("INSERT INTO meta VALUES ('raw_fields', ?)", (json.dumps(list(RAW_FIELDS)),))
                return db, [], list(RAW_FIELDS), 0, []
            if tables != {"meta", "samples"}:
                raise CorruptFile(f"tables {sorted(tables)}, expected ['meta', 'samples']")
            meta = dict(db.execute("SELECT key, value FROM meta"))
            version = int(meta.get("schema_version", "0"))
            if version > SCHEMA_VERSION:
                raise SampleStoreVersionError(f"sample store {self.path}: schema_version {version} is newer than this router's "
                                 f"{SCHEMA_VERSION}; use a newer router or another samples.path")
            if version not in (1, SCHEMA_VERSION) or "raw_fields" not in meta:
                raise CorruptFile(f"meta has schema_version {meta.get('schema_version')!r}, raw_fields "
                                   f"{'present' if 'raw_fields' in meta else 'missing'}")
            fields = json.loads(meta["raw_fields"])
            counters = json.loads(meta.get("counters", "{}"))
            if version == 1:
                add_crcs(db, fields)
            rows = db.execute("SELECT * FROM samples ORDER BY seq").fetchall()
        except SampleStoreVersionError:
            db.close()
            raise
        except sqlite3.Error as exc:
            db.close()
            if is_full(exc):
                raise
            raise CorruptFile(f"{type(exc).__name__}: {exc}") from exc
        except (ValueError, TypeError, KeyError) as exc:
            db.close()
            raise CorruptFile(f"{type(exc).__name__}: {exc}") from exc
        layout = layout_crc(fields)
        bad = [(r, "checksum mismatch") for r in rows if r[10] != row_crc(r, layout)]
        if bad:
            rows = [r for r in rows if r[10] == row_crc(r, layout)]
        self._next_seq = max(int(counters.get("next_seq", 1)), (rows[-1][0] + 1) if rows else 1,
                             int(meta.get("seq_reserved", 0)))
        self._seq_reserved = self._next_seq
        self.added_total = int(counters.get("added_total", len(rows)))
        self.evicted_total = int(counters.get("evicted_total", 0))
        skipped = 0
        if not set(RAW_FIELDS) <= set(fields):
            skipped = len(rows)
            with db:  # these rows can never be served: start the file over in the current layout
                db.execute("DELETE FROM samples")
                db.execute("INSERT OR REPLACE INTO meta VALUES ('raw_fields', ?)", (json.dumps(list(RAW_FIELDS)),))
            rows, fields = [], list(RAW_FIELDS)
        elif fields != list(RAW_FIELDS):
            rows = self._migrate(db, rows, fields)
            fields = list(RAW_FIELDS)
        return db, rows, fields, skipped, bad

    def _migrate(self, db: sqlite3.Connection, rows: list, fields: list[str]) -> list:
        """Rewrite rows stored with another field order (or extra fields) in the current layout."""
        cols = np.array([fields.index(f) for f in RAW_FIELDS], dtype=np.int64)
        out = []
        for row in rows:
            feats = np.frombuffer(row[5], dtype="<f8") if isinstance(row[5], bytes) else np.empty(0)
            blob = feats[cols].astype("<f8").tobytes() if feats.size == len(fields) else b""
            values = row[:5] + (blob,) + row[6:10]
            out.append(values + (row_crc(values, CURRENT_LAYOUT_CRC),))
        with db:
            db.executemany("UPDATE samples SET features = ?, crc = ? WHERE seq = ?", [(r[5], r[10], r[0]) for r in out])
            db.execute("INSERT OR REPLACE INTO meta VALUES ('raw_fields', ?)", (json.dumps(list(RAW_FIELDS)),))
        log.info("sample store %s: %d rows rewritten from fields %s to %s", self.path, len(out), fields,
                 list(RAW_FIELDS))
        return out

    def _load(self, rows: list, fields: list[str]) -> None:
        cols = np.array([fields.index(f) for f in RAW_FIELDS], dtype=np.int64)
        bad = []
        for seq, target, request_id, endpoint_id, role, blob, observed, predicted, version, recorded, _ in rows:
            feats = np.frombuffer(blob, dtype="<f8") if isinstance(blob, bytes) else np.empty(0)
            if (feats.size != len(fields) or target not in TARGETS or role not in ROLE_CODE
                    or not np.isfinite(feats[cols]).all()):
                bad.append(seq)
                continue
            row = feats[cols].tolist() + [observed, math.nan if predicted is None else predicted, recorded]
            self._insert(seq, row, target, role, request_id, endpoint_id, version)
        gone = bad + self._evicted_seqs
        if bad:
            log.warning("sample store %s: %d malformed rows skipped and removed (first seq %d)", self.path,
                        len(bad), bad[0])
        if gone:
            with self._db:
                self._db.executemany("DELETE FROM samples WHERE seq = ?", [(q,) for q in gone])
                self._write_counters()
        self._evicted_seqs.clear()

    def _quarantine(self, bad: list[tuple[tuple, str]]) -> None:
        """Append rows that failed their check to a side file (kept for inspection) and drop them from the store."""
        if not bad:
            return
        side = self.path.with_name(f"{self.path.name}.quarantine-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.jsonl")
        try:
            with open(side, "a") as f:
                for row, reason in bad:
                    values = [v.hex() if isinstance(v, bytes) else v for v in row]
                    f.write(json.dumps({"seq": row[0], "reason": reason, "row": values}) + "\n")
        except OSError as exc:
            side = f"nowhere ({exc.strerror})"
        with self._db:
            self._db.executemany("DELETE FROM samples WHERE seq = ?", [(r[0],) for r, _ in bad])
        log.warning("sample store %s: %d rows failed their checksum (first seq %d): quarantined to %s and removed",
                    self.path, len(bad), bad[0][0][0], side)

    def _write_salvage(self, salvage: "Salvage") -> None:
        """A fresh file at self.path holding the salvaged rows, counters and a high-water mark past them."""
        db, *_ = self._read_file()
        layout = layout_crc(salvage.fields)
        rows = [r if r[10] is not None else r[:10] + (row_crc(r, layout),) for r in salvage.rows]
        with db:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('raw_fields', ?)", (json.dumps(salvage.fields),))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('counters', ?)", (json.dumps(salvage.counters),))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('seq_reserved', ?)", (str(salvage.next_seq),))
            db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        db.close()
