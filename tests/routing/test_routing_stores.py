"""The routing service's stores under faults: real files, real processes, a real full disk.

Model store and sample store: names that would be the store's own files,
a second writer on the same store (another process, SIGKILLed afterwards),
a damaged page or a flipped byte in the sample file, sequence numbers across
a SIGKILL, and a full disk (a small tmpfs, mounted when the tests run as root)
under a publish and under a sample flush. Over HTTP (uvicorn on 127.0.0.1):
the 422 and 507 answers and ids holding '/'.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

from routing.http.app import create_app
from routing.config import RouterConfig
from routing.features import RAW_FIELDS
from routing.fleet.requests import Sample
from routing.models.store import ModelStore
from routing.fleet.registry import Endpoint
from routing.samples.format import SEQ_BLOCK
from routing.samples.store import SampleStore
from routing.store_guard import StoreFullError, StoreLockedError
from tests.support.fixtures_retrain import TOKEN_ENV, router_process
from tests.support.fixtures_routing import PROFILE_DIR, PROJECT_ROOT, TOKEN, RunningServer, h200_profile, linear_document

AUTH = {"Authorization": f"Bearer {TOKEN}"}
PAGE_SIZE = 4096  # SQLite's default, which the sample store keeps


def sample(rid: str, *, observed: float = 100.0, kv: float = 0.05) -> Sample:
    feats = {f: 0.0 for f in RAW_FIELDS} | {"kv_usage_frac": kv, "input_tokens": 100.0}
    return Sample(target="ttft", request_id=rid, endpoint_id="e0", role="prefill", features=feats,
                  observed_ms=observed, predicted_ms=None, model_version=None, recorded_at_s=1.0)


def stored(store: SampleStore) -> list[dict]:
    return store.page(after_seq=0, limit=100_000).samples


def file_ids(path: Path) -> list[str]:
    """Request ids in the file, read with plain sqlite3 (no store lock involved)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [r[0] for r in db.execute("SELECT request_id FROM samples ORDER BY seq")]


@contextlib.contextmanager
def child(code: str):
    """A python process running `code` (stdout piped, a line at a time); SIGKILLed on exit if still alive."""
    proc = subprocess.Popen([sys.executable, "-u", "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=PROJECT_ROOT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


def wait_line(proc: subprocess.Popen, expected: str) -> None:
    line = proc.stdout.readline().strip()
    assert line == expected, f"child said {line!r}, stderr: {proc.stderr.read() if proc.poll() is not None else ''}"


# -- reserved and unsafe names ---------------------------------------------------


@pytest.mark.parametrize("version", ["state", "State", "STATE"])
def test_a_version_named_like_the_state_file_is_refused_and_the_store_still_restarts(tmp_path, version):
    store = ModelStore(directory=tmp_path)
    store.publish(linear_document("v1"), now_s=1.0)
    state_before = (tmp_path / "state.json").read_bytes()
    with pytest.raises(ValueError, match=rf"^version: '{version}' is reserved \(the model store keeps its state.json"):
        store.publish(linear_document(version), now_s=2.0)
    assert store.active.version == "v1" and (tmp_path / "state.json").read_bytes() == state_before
    store.close()
    # Before: state.json held the model record, and the next start failed on it.
    assert ModelStore(directory=tmp_path).active.version == "v1"


@pytest.mark.parametrize("version", ["../escape", ".hidden", "a/b", "a\\b", ""])
def test_path_like_versions_are_refused_before_any_file_is_written(tmp_path, version):
    store = ModelStore(directory=tmp_path)
    with pytest.raises(ValueError, match="version"):
        store.publish(linear_document(version), now_s=1.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]


def test_a_state_file_naming_an_unsafe_version_is_a_startup_error(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"order": ["../../etc/passwd"], "history": []}))
    for _ in range(2):  # the same error again, not "in use": a store that fails to load lets its lock go
        with pytest.raises(ValueError, match=r"state.json: lists an unsafe version name: version: '../../etc/passwd'"):
            ModelStore(directory=tmp_path)


# -- one writer per store ---------------------------------------------------------


def test_a_second_model_store_on_one_directory_is_refused_until_the_holder_dies(tmp_path):
    with child(f"""
        from routing.models.store import ModelStore
        store = ModelStore(directory={str(tmp_path)!r})
        print("ready")
        import time; time.sleep(60)
    """) as holder:
        wait_line(holder, "ready")
        with pytest.raises(StoreLockedError) as err:
            ModelStore(directory=tmp_path)
        message = str(err.value)
        assert "\n" not in message
        assert message.startswith(f"model store {tmp_path} is in use by another router (pid {holder.pid}, lock ")
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    ModelStore(directory=tmp_path).publish(linear_document("after"), now_s=1.0)  # the kernel dropped the lock


def test_a_second_router_on_the_same_stores_refuses_to_start_naming_the_path_and_pid(tmp_path):
    extra = f"samples: {{capacity: 1000, path: {tmp_path / 'samples.sqlite3'}}}\n"
    with router_process(tmp_path, extra_yaml=extra) as first:
        second = subprocess.run(
            [str(Path(sys.executable).with_name("sla-planner")), "router", "--port", "1",
             "--config", str(tmp_path / "routing.yaml")],
            capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT,
            env={**os.environ, TOKEN_ENV: "x"},
        )
        assert second.returncode == 2, second.stderr
        lines = [line for line in second.stderr.splitlines() if line.startswith("sla-planner router:")]
        assert lines == [f"sla-planner router: model store {first.models_dir} is in use by another router "
                         f"(pid {first.proc.pid}, lock {first.models_dir / '.lock'}): one writer per store; "
                         "stop that router or give this one its own path"], second.stderr
        with first.client() as c:
            assert c.get("/healthz").json()["status"] == "ok"  # the first one never noticed


# -- sequence numbers across a crash ------------------------------------------------


def wait_for(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _kill_mid_writing(path: Path) -> tuple[list[int], int]:
    """SIGKILL a store writer while it hands out numbers; (numbers it handed out, rows in the file)."""
    # Only the 1 s timer flushes (flush_rows above anything written here): the samples added since the
    # last flush exist only in memory when the kill comes.
    with child(f"""
        from routing.samples.store import SampleStore
        from tests.routing.test_routing_stores import sample
        store = SampleStore(capacity=100_000, path={str(path)!r}, flush_rows=10_000_000)
        k = 0
        while True:
            k += 1
            print(store.add(sample(f"r{{k}}")))
    """) as writer:
        # Read its output all the time, so it never blocks on a full pipe while the 1 s flush catches up.
        seen: list[int] = []
        reader = threading.Thread(target=lambda: seen.extend(int(line) for line in writer.stdout), daemon=True)
        reader.start()
        wait_for(lambda: len(seen) >= 3000)
        with pytest.raises(StoreLockedError, match=rf"sample store {path} is in use by another router \(pid {writer.pid},"):
            SampleStore(capacity=10, path=path)
        busy_from = len(seen)
        wait_for(lambda: len(seen) >= busy_from + 500)  # still handing out numbers when the kill comes
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
        reader.join(timeout=10)
    return seen, len(file_ids(path))


def test_sequence_numbers_never_repeat_after_a_sigkill_mid_writing(tmp_path):
    # The kill must land while handed-out numbers are still only in memory; a kill that happens to
    # come just after a flush (a loaded machine can stall the writer there) is tried again.
    for attempt in range(3):
        path = tmp_path / f"samples-{attempt}.sqlite3"
        seen, in_file = _kill_mid_writing(path)
        assert seen == list(range(1, len(seen) + 1))
        if in_file < len(seen):
            break
    assert in_file < len(seen), "the kill should come before every handed-out number reached the file"
    again = SampleStore(capacity=100_000, path=path)
    nxt = again.add(sample("after-kill"))
    # Before: numbering resumed after the last flushed row, re-issuing numbers readers had already paged past.
    assert max(seen) < nxt <= max(seen) + SEQ_BLOCK + 1
    again.close()
    # A clean close gives the unused reservation back: no gap after it.
    third = SampleStore(capacity=100_000, path=path)
    assert third.add(sample("after-close")) == nxt + 1
    third.close()


# -- damaged files ------------------------------------------------------------------


def _page_of(path: Path, needle: bytes) -> int:
    data = path.read_bytes()
    assert data.count(needle) == 1, needle
    return data.index(needle) // PAGE_SIZE


def test_a_damaged_page_loses_only_its_rows(tmp_path, caplog):
    path = tmp_path / "samples.sqlite3"
    store = SampleStore(capacity=10_000, path=path)
    for k in range(3000):
        store.add(sample(f"r{k:05d}", observed=float(k)))
    before = {s["request_id"]: s for s in stored(store)}
    store.close()
    page = _page_of(path, b"r01500")
    with open(path, "r+b") as f:  # a torn or rotten page: its b-tree header is garbage
        f.seek(page * PAGE_SIZE)
        f.write(b"\xff" * 64)
    with caplog.at_level("WARNING", logger="routing.samples.store"):
        again = SampleStore(capacity=10_000, path=path)
    got = stored(again)
    lost = sorted(set(before) - {s["request_id"] for s in got})
    # Before: the whole file went aside and the store started empty (0 of 3000).
    assert 0 < len(lost) <= PAGE_SIZE // 100, lost  # one leaf page's rows, ~25
    assert "r01500" in lost
    assert lost == [f"r{k:05d}" for k in range(int(lost[0][1:]), int(lost[-1][1:]) + 1)]  # one stretch
    assert all(s == before[s["request_id"]] for s in got)  # everything kept is exactly as stored
    aside = list(tmp_path.glob("samples.sqlite3.corrupt-*"))
    assert len(aside) == 1
    assert f"moved to {aside[0]}; {len(got)} rows salvaged from it (1 unreadable stretches skipped)" in caplog.text
    assert again.add(sample("next")) > 3000 + SEQ_BLOCK  # past anything the lost pages may have held
    again.close()
    assert len(stored(SampleStore(capacity=10_000, path=path))) == len(got) + 1  # the new file is whole


def test_a_flipped_byte_inside_a_row_is_quarantined_not_served(tmp_path, caplog):
    path = tmp_path / "samples.sqlite3"
    store = SampleStore(capacity=100, path=path)
    for k in range(20):
        store.add(sample(f"r{k}", observed=4321.125 if k == 7 else 100.0 + k))
    store.close()
    data = bytearray(path.read_bytes())
    at = data.index(struct.pack(">d", 4321.125))  # SQLite stores REAL big-endian
    data[at + 7] ^= 0x01  # the last mantissa bit: 4321.125 -> 4321.125000000001, a plausible value
    path.write_bytes(data)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"  # SQLite cannot see this
    with caplog.at_level("WARNING", logger="routing.samples.store"):
        again = SampleStore(capacity=100, path=path)
    # Before: r7 came back with the altered latency, silently.
    assert [s["request_id"] for s in stored(again)] == [f"r{k}" for k in range(20) if k != 7]
    (side,) = tmp_path.glob("samples.sqlite3.quarantine-*.jsonl")
    (line,) = side.read_text().splitlines()
    record = json.loads(line)
    assert record["seq"] == 8 and record["reason"] == "checksum mismatch" and record["row"][2] == "r7"
    assert record["row"][6] == struct.unpack(">d", bytes(data[at:at + 8]))[0]
    assert f"1 rows failed their checksum (first seq 8): quarantined to {side} and removed" in caplog.text
    again.close()
    assert "r7" not in file_ids(path)


def test_a_schema_1_file_gains_checksums_and_keeps_its_rows(tmp_path):
    path = tmp_path / "samples.sqlite3"
    store = SampleStore(capacity=10, path=path)
    for k in range(3):
        store.add(sample(f"r{k}"))
    store.close()
    with sqlite3.connect(path) as db:  # as a router before row checksums wrote it
        db.execute("ALTER TABLE samples DROP COLUMN crc")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    again = SampleStore(capacity=10, path=path)
    assert [s["request_id"] for s in stored(again)] == ["r0", "r1", "r2"]
    again.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("2",)
        assert db.execute("SELECT count(*) FROM samples WHERE crc IS NULL").fetchone() == (0,)


# -- request ids and '/' ---------------------------------------------------------------


@contextlib.contextmanager
def serve(overrides: dict | None = None):
    cfg = RouterConfig.model_validate({"profile_dir": str(PROFILE_DIR), "seed": 1, **(overrides or {})})
    app = create_app(cfg, token=TOKEN, profile=h200_profile())
    with RunningServer(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        svc = app.state.service
        svc.register(Endpoint(id="p0", role="prefill", url=None, domains={}))
        svc.register(Endpoint(id="d0", role="decode", url=None, domains={}))
        yield client, svc


def test_ids_holding_a_slash_are_refused_with_a_message_and_colons_still_work():
    with serve({"picker": {"slo": {"enabled": False}}}) as (client, svc):
        resp = client.post("/v1/route", json={"input_tokens": 100, "request_id": "tenant/42"})
        assert resp.status_code == 422 and resp.json()["fields"][0]["field"] == "body.request_id"
        body = {"prefill_endpoint_id": "p0", "decode_endpoint_id": "d0", "input_tokens": 100}
        for path, payload in (("/v1/requests/tenant%2F42/dispatched", body),
                              ("/v1/requests/tenant%2F42/first_token", {"observed_ttft_ms": 10.0}),
                              ("/v1/endpoints/zone%2Fp1/metrics", {"kv_usage_frac": 0.1})):
            resp = client.request("PUT" if "metrics" in path else "POST", path, json=payload)
            # Before: a bare 404 "Not Found" (the %2F is decoded before routing, so no route matched).
            assert resp.status_code == 422, (path, resp.text)
            assert resp.json()["message"] == ("path: holds an encoded '/' (%2F); "
                                              "request and endpoint ids cannot contain '/'")
        # The same lifecycle with an id the pattern allows goes through end to end.
        assert client.post("/v1/requests/tenant:42/dispatched", json=body).status_code == 201
        resp = client.post("/v1/requests/tenant:42/first_token", json={"observed_ttft_ms": 10.0})
        assert resp.status_code == 200 and resp.json()["samples_recorded"] == 1
        assert svc.samples.page(after_seq=0).samples[-1]["request_id"] == "tenant:42"


def test_a_version_named_state_gets_a_one_line_422_over_http(tmp_path):
    with serve({"models": {"dir": str(tmp_path / "models")}}) as (client, svc):
        resp = client.post("/v1/models", json=linear_document("state"), headers=AUTH)
        assert resp.status_code == 422
        body = resp.json()
        assert body["message"].startswith("version: 'state' is reserved") and "\n" not in body["message"]
        assert body["fields"][0]["field"] == "body.version"
        assert client.post("/v1/models", json=linear_document("v1"), headers=AUTH).status_code == 201


# -- a full disk ----------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (needs root: CI and this machine run as root) and a way to fill it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def fill(mnt: Path, *, leave_bytes: int = 0) -> Path:
    """Take every free byte of the file system but `leave_bytes` (rounded to its blocks)."""
    st = os.statvfs(mnt)
    filler = mnt / "filler"
    with open(filler, "ab") as f:
        f.write(b"\0" * max(st.f_bavail * st.f_frsize - leave_bytes, 0))
    return filler


@pytest.mark.parametrize("leave_bytes", [
    pytest.param(0, id="full before the model file"),
    pytest.param(PAGE_SIZE, id="room for the model file, not for the state"),
])
def test_a_publish_on_a_full_disk_changes_nothing_and_the_store_restarts(small_disk, leave_bytes):
    models = small_disk / "models"
    store = ModelStore(directory=models, keep_versions=2)
    store.publish(linear_document("v1"), now_s=1.0)
    store.publish(linear_document("v2"), now_s=2.0)
    files_before = {p.name: p.read_bytes() for p in models.iterdir()}
    fill(small_disk, leave_bytes=leave_bytes)
    with pytest.raises(StoreFullError) as err:
        store.publish(linear_document("v3"), now_s=3.0)  # would evict v1
    assert str(err.value) == (f"model store {models}: No space left on device writing "
                              f"{'v3.json' if leave_bytes == 0 else 'state.json'} while publishing version 'v3'; "
                              "nothing changed, version 'v2' still serves")
    assert store.active.version == "v2" and [v["version"] for v in store.list()] == ["v1", "v2"]
    # Exactly the files there were: no v3.json left behind, v1.json kept (the state still names it).
    assert {p.name: p.read_bytes() for p in models.iterdir()} == files_before
    fill(small_disk)  # whatever the failed publish gave back
    with pytest.raises(StoreFullError, match="while rolling back; nothing changed"):
        store.rollback()
    assert store.active.version == "v2"
    store.close()
    again = ModelStore(directory=models, keep_versions=2)
    assert again.active.version == "v2" and [v["version"] for v in again.list()] == ["v1", "v2"]
    again.close()


def test_a_publish_on_a_full_disk_is_a_507_and_the_previous_model_keeps_serving(small_disk):
    with serve({"models": {"dir": str(small_disk / "models")}}) as (client, svc):
        assert client.post("/v1/models", json=linear_document("v1"), headers=AUTH).status_code == 201
        filler = fill(small_disk)
        resp = client.post("/v1/models", json=linear_document("v2"), headers=AUTH)
        # Before: 500 internal_error with an OSError text.
        assert resp.status_code == 507, resp.text
        assert resp.json()["error"] == "insufficient_storage"
        assert resp.json()["message"].endswith("nothing changed, version 'v1' still serves")
        assert client.get("/v1/models").json()["active"] == "v1"
        resp = client.post("/v1/models/rollback", json={}, headers=AUTH)
        assert resp.status_code == 507 and client.get("/v1/models").json()["active"] == "v1"
        filler.unlink()
        assert client.post("/v1/models", json=linear_document("v2"), headers=AUTH).status_code == 201
        svc.models.close()


def test_a_sample_flush_on_a_full_disk_keeps_the_file_and_retries_until_it_fits(small_disk, caplog):
    path = small_disk / "samples.sqlite3"
    store = SampleStore(capacity=10_000, path=path, flush_interval_s=0.05, flush_rows=10**9)
    for k in range(10):
        store.add(sample(f"early{k}"))
    store.flush()
    filler = fill(small_disk)
    with caplog.at_level("ERROR", logger="routing.samples.store"):
        for k in range(500):  # ~100 KiB of rows: the file system holds them only once the filler goes
            store.add(sample(f"late{k}"))
        store.flush()
    stats = store.stats()
    assert stats["persist_errors_total"] >= 1 and stats["pending_writes"] == 500
    assert re.search(rf"sample store {re.escape(str(path))}: disk full writing \d+ samples \(database or disk is full\)",
                     caplog.text), caplog.text
    assert len(store) == 510  # routing and paging go on from memory
    with sqlite3.connect(path) as db:  # the file is the last good batch, intact
        assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    assert file_ids(path) == [f"early{k}" for k in range(10)]
    filler.unlink()
    deadline = time.monotonic() + 10
    while store.stats()["pending_writes"] and time.monotonic() < deadline:
        time.sleep(0.05)  # the timer retries on its own
    assert store.stats()["pending_writes"] == 0
    store.close()
    assert len(file_ids(path)) == 510
