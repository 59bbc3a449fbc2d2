"""Real data sets are resolved through configuration and checked against their sha256."""
import pytest

from funnelrag import datasets


def test_registered_files_verify_in_mirror(data_mirror, tmp_path):
    for name in ("enwiki-sample", "t5-tokenizer", "nq-open-test"):
        path = datasets.resolve(name, data_mirror, cache_dir=tmp_path)
        assert path.exists()
    assert (tmp_path / "verified.json").exists()  # stamp so big files are hashed once


def test_checksum_mismatch_names_file(tmp_path):
    bad = tmp_path / "mirror" / datasets.REGISTRY["nq-open-test"].relpath
    bad.parent.mkdir(parents=True)
    bad.write_text("not the real file\n")
    with pytest.raises(ValueError, match="checksum mismatch") as err:
        datasets.resolve("nq-open-test", tmp_path / "mirror")
    assert str(bad) in str(err.value)


def test_missing_without_cache_dir_is_clear(tmp_path):
    with pytest.raises(datasets.DataUnavailable, match="nq-open-test"):
        datasets.resolve("nq-open-test", tmp_path)
    with pytest.raises(KeyError):
        datasets.resolve("no-such-set", tmp_path)
