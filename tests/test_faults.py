"""Faults that must never pass quietly: each names what failed (file, shard, run) and leaves no
half-written output or stale state behind."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from data_contracts.base import atomic_write, atomic_write_bytes


# ------------------------------------------------------------------ disk full during an artifact write

def _disk_full(_path: Path) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_names_the_path_and_keeps_errno(tmp_path):
    final = tmp_path / "stores" / "x.parquet"
    final.parent.mkdir(parents=True)
    final.write_bytes(b"old")
    with pytest.raises(OSError) as info:
        atomic_write(final, _disk_full)
    assert info.value.errno == errno.ENOSPC
    assert str(final) in str(info.value) and "disk" in str(info.value).lower()
    assert final.read_bytes() == b"old"
    assert sorted(p.name for p in final.parent.iterdir()) == ["x.parquet"]   # no temporary left


def test_quota_exceeded_names_the_path(tmp_path, monkeypatch):
    def no_quota(self, data):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(Path, "write_bytes", no_quota)
    final = tmp_path / "y.json"
    with pytest.raises(OSError) as info:
        atomic_write_bytes(final, b"{}")
    assert info.value.errno == errno.EDQUOT and str(final) in str(info.value)


def test_other_os_errors_pass_unchanged(tmp_path):
    def denied(_path):
        raise PermissionError(errno.EACCES, "Permission denied")

    with pytest.raises(PermissionError, match="Permission denied"):
        atomic_write(tmp_path / "z", denied)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs (root only; skipped where mounting is not allowed)."""
    import subprocess  # noqa: PLC0415

    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_disk_full_on_a_real_small_file_system(tiny_tmpfs):
    import pyarrow as pa  # noqa: PLC0415

    from data_contracts.base import Contract, ContractWriter  # noqa: PLC0415

    final = tiny_tmpfs / "big.bin"
    with pytest.raises(OSError) as info:
        atomic_write_bytes(final, b"x" * (1 << 20))
    assert info.value.errno == errno.ENOSPC and str(final) in str(info.value)
    assert list(tiny_tmpfs.iterdir()) == []

    contract = Contract(name="blobs", filename="blobs.parquet", schema=pa.schema([("b", pa.binary())]))
    with pytest.raises(OSError) as info, ContractWriter(contract, tiny_tmpfs, row_group_size=None) as w:
        w.write({"b": [os.urandom(16384) for _ in range(16)]})
    assert info.value.errno == errno.ENOSPC and "blobs.parquet" in str(info.value)
    assert list(tiny_tmpfs.iterdir()) == []


# ------------------------------------------------------------------ a CSV-quoted questions file named .tsv

def test_csv_quoted_tsv_is_read_as_dpr_csv(tmp_path):
    from tasks.funnel.questions import read_questions  # noqa: PLC0415

    comma = tmp_path / "trivia-test.tsv"          # pyserini's TriviaQA: comma-separated, quoted
    comma.write_text('"Who wrote Babbitt?","[\'Sinclair Lewis\', \'Lewis\']"\n'
                     '"Which ""Bond"" film came first?","[\'Dr. No\']"\n', encoding="utf-8")
    tab = tmp_path / "nq-test.tsv"                # DPR's qa.csv quoting with tab separators
    tab.write_text('who wrote babbitt\t"[""Sinclair Lewis""]"\n', encoding="utf-8")
    rows = read_questions(comma)
    assert [(r["question"], r["answers"]) for r in rows] == [
        ("Who wrote Babbitt?", ["Sinclair Lewis", "Lewis"]), ('Which "Bond" film came first?', ["Dr. No"])]
    assert [(r["question"], r["answers"]) for r in read_questions(tab)] == [("who wrote babbitt", ["Sinclair Lewis"])]


def test_csv_quoted_record_later_in_a_tsv_names_dpr_csv(tmp_path):
    from tasks.funnel.questions import read_questions  # noqa: PLC0415

    mixed = tmp_path / "mixed.tsv"
    mixed.write_text("who wrote babbitt\t['Sinclair Lewis']\n"
                     'who is bond\t"[\'Sean Connery\']"\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"mixed\.tsv:2: .*format: dpr-csv"):
        read_questions(mixed)
