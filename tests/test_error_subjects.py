"""Errors of the nightly path name their subject: a full disk during a shard write names the file
being written (pyarrow's own error says ``Error writing bytes to file`` and nothing else), and a
dropped or refused connection names the URL and the file being downloaded."""
from __future__ import annotations

import errno
import hashlib
import os
import subprocess

import httpx
import pyarrow as pa
import pytest

from tasks.corpus.sharded import segment_memo as SM
from tasks.sources.dump_source import DownloadFailed, Mirror, RemoteFile, fetch
from tasks.corpus.sharded.shards import put_cached
from tests.mirror_server import serve

ARROW_ENOSPC = "Error writing bytes to file. Detail: [errno 28] No space left on device"   # pyarrow's words


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs (root only; skipped where mounting is not allowed)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", "--lazy", str(mnt)], check=False)   # lazy: a traceback may still hold a file open


def _rows(n_bytes: int) -> pa.Table:
    return pa.table({"text": [os.urandom(1024).hex() for _ in range(n_bytes // 2048)]})


def test_a_full_disk_during_a_segment_shard_write_names_the_file(tiny_tmpfs):
    entry = tiny_tmpfs / "segment-shard-entry"
    with pytest.raises(OSError) as info:
        put_cached(entry, lambda tmp: SM.write_rows(tmp / SM.UNITS_FILE, _rows(256 << 10)))
    assert info.value.errno == errno.ENOSPC
    assert SM.UNITS_FILE in str(info.value) and "disk" in str(info.value).lower()
    assert list(tiny_tmpfs.iterdir()) == []   # no entry, no temporary directory


def test_a_disk_full_error_naming_no_file_is_given_one(tmp_path, monkeypatch):
    def full(path, schema):
        raise OSError(errno.ENOSPC, ARROW_ENOSPC)

    monkeypatch.setattr(SM.ipc, "new_file", full)
    entry = tmp_path / "cache" / "segment-shard-entry"
    with pytest.raises(OSError) as info:   # the file being written, not only the cache entry
        put_cached(entry, lambda tmp: SM.write_rows(tmp / SM.PASSAGES_FILE, _rows(4096)))
    assert info.value.errno == errno.ENOSPC and SM.PASSAGES_FILE in str(info.value)
    assert str(info.value).count("while writing") == 1

    def numpy_full(tmp):
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError) as info:   # a write of the entry that names nothing: the entry
        put_cached(entry, numpy_full)
    assert info.value.errno == errno.ENOSPC and str(entry) in str(info.value)
    assert not entry.exists() and list(entry.parent.iterdir()) == []


def test_a_dropped_connection_names_the_url_and_the_file(tmp_path):
    data = os.urandom(300_000)
    (tmp_path / "mirror" / "w").mkdir(parents=True)
    (tmp_path / "mirror" / "w" / "dump.xml.bz2").write_bytes(data)
    remote = RemoteFile("w/dump.xml.bz2", len(data), hashlib.sha1(data).hexdigest(), "sha1")
    with serve(tmp_path / "mirror") as server, Mirror(server.url, retries=0) as mirror:
        server.cut[remote.relpath] = 100_000
        with pytest.raises(DownloadFailed) as info:
            fetch(mirror, remote, tmp_path / "dl")
        part = tmp_path / "dl" / "w" / "dump.xml.bz2.part"
        message = str(info.value)
        assert f"{server.url}/w/dump.xml.bz2" in message and str(part) in message
        assert "RemoteProtocolError" in message and "100,000 of 300000 bytes kept" in message
        assert isinstance(info.value, httpx.HTTPError) and isinstance(info.value.__cause__, httpx.RemoteProtocolError)
        assert fetch(mirror, remote, tmp_path / "dl").read_bytes() == data   # resumed


def test_a_refused_connection_names_the_url():
    with Mirror("http://127.0.0.1:9", timeout_s=5, retries=0) as mirror:
        with pytest.raises(DownloadFailed, match=r"http://127\.0\.0\.1:9/w/20260101/dumpstatus\.json: ConnectError"):
            mirror.read_text("w/20260101/dumpstatus.json")
