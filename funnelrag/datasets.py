"""The real input data sets: where they live, their checksums, and their public sources.

Library code never hard-codes the location of the data mirror: callers pass ``mirror`` (from
config). :func:`default_mirror` is only used at the CLI/config boundary.
"""
from __future__ import annotations

import json
import os
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from data_contracts.base import atomic_write, sha256_file


@dataclass(frozen=True)
class DataFile:
    """One file of a real data set: path relative to the mirror, sha256, canonical URL."""

    relpath: str
    sha256: str
    url: str


REGISTRY: dict[str, DataFile] = {
    "wikispeedia-articles": DataFile(
        "wikispeedia/wikispeedia_articles_plaintext.tar.gz",
        "058d46d968103361dfce8c83441f8573c46ad03906f2d2fb14fe645126a5b4fc",
        "https://snap.stanford.edu/data/wikispeedia/wikispeedia_articles_plaintext.tar.gz"),
    "wikispeedia-graph": DataFile(
        "wikispeedia/wikispeedia_paths-and-graph.tar.gz",
        "34f535c2aeaa6705f31812364ff8fce13055af5cba5218314ee8e3f665c56ede",
        "https://snap.stanford.edu/data/wikispeedia/wikispeedia_paths-and-graph.tar.gz"),
    "enwiki-sample": DataFile(
        "enwiki-sample/enwiki-20160501-pages-articles-shortened.xml.bz2",
        "a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d",
        "https://github.com/RaRe-Technologies/gensim/raw/develop/gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"),
    "nq-open-dev": DataFile(
        "nq-open/nq-open-dev.tsv",
        "9c168e4eb4006fa7cc44b67a1e903767a2a9f8b70e24110f3d1aa78561f03774",
        "https://raw.githubusercontent.com/castorini/anserini-tools/master/topics-and-qrels/topics.nq.dev.txt"),
    "nq-open-test": DataFile(
        "nq-open/nq-open-test.tsv",
        "2873bfca090c67659ae9b1a1488634ccf8778805659b72a7cdb29f2cc900a415",
        "https://raw.githubusercontent.com/castorini/anserini-tools/master/topics-and-qrels/topics.nq.test.txt"),
    "nq-open-oracle": DataFile(
        "nq-open/nq-open-oracle.jsonl.gz",
        "6a7f72b846f663a133ef952244e5a4e43f06bcf190afe34e8fbe687ce0d1653e",
        "https://github.com/nelson-liu/lost-in-the-middle/raw/main/qa_data/nq-open-oracle.jsonl.gz"),
    "hotpotqa-dev-subsampled": DataFile(
        "hotpotqa/hotpotqa_dev_subsampled.jsonl",
        "837a919903fedf521211c4271f168ad5458488198e9c4d967bf5f3a579525ce8",
        "https://github.com/StonyBrookNLP/ircot/raw/main/processed_data/hotpotqa/dev_subsampled.jsonl"),
    "t5-tokenizer": DataFile(
        "t5-tokenizer/tokenizer.json",
        "69de1c7e0467710c628c93b139fe8817a9cd624a74b4341a41ff786fc5119f7a",
        "https://huggingface.co/google-t5/t5-base/resolve/main/tokenizer.json"),
    "t5-tokenizer-config": DataFile(
        "t5-tokenizer/tokenizer_config.json",
        "d2123ec8633624230b23c00bacc20875fcacf0abd94fdf86724145d1c52f9c1d",
        "https://huggingface.co/google-t5/t5-base/resolve/main/tokenizer_config.json"),
}


class DataUnavailable(FileNotFoundError):
    """A registered data file is neither in the mirror nor downloadable."""


# What a process without a mirror (e.g. a Prefect worker started elsewhere than the checkout) lacks.
_MIRROR_HINT = ("; no data mirror is configured: set FUNNELRAG_DATA_MIRROR to the data directory in the "
                "environment of the process that runs the flow (for deployments: of `prefect worker start`), "
                "or workspace.data_mirror in the config")


def default_home() -> Path:
    """The default funnelrag home: ``$FUNNELRAG_HOME`` or ``./funnelrag-home``. Only for use at the
    configuration boundary (config defaults, CLI options)."""
    return Path(os.environ.get("FUNNELRAG_HOME") or "funnelrag-home")


def default_mirror(start: Path | None = None) -> Path | None:
    """The default data mirror: ``$FUNNELRAG_DATA_MIRROR`` or the first ``../shared/data``
    found from ``start`` (default: the current directory) or from this checkout. Only for
    use at the configuration boundary."""
    env = os.environ.get("FUNNELRAG_DATA_MIRROR")
    if env:
        return Path(env)
    candidates = [Path(start or Path.cwd()).resolve(), Path(__file__).resolve().parents[1]]
    for base in candidates:
        for parent in (base, *base.parents):
            cand = parent / ".." / "shared" / "data"
            if (cand / "README.md").exists() or (cand / "wikispeedia").exists():
                return cand.resolve()
    return None


def resolve(name: str, mirror: Path | None, cache_dir: Path | None = None, verify: bool = True) -> Path:
    """Return a local path to the registered file ``name``, checking its sha256.

    Looks in ``mirror`` first, then ``cache_dir``; if neither has it, downloads the canonical
    URL into ``cache_dir`` (machines with internet only).

    Raises
    ------
    KeyError
        ``name`` is not registered.
    DataUnavailable
        Not in the mirror and the download failed.
    ValueError
        The file exists but its sha256 does not match (names file, expected and found digest).
    """
    entry = REGISTRY[name]
    candidates = []
    if mirror is not None:
        candidates.append(Path(mirror) / entry.relpath)
    if cache_dir is not None:
        candidates.append(Path(cache_dir) / entry.relpath)
    for path in candidates:
        if path.exists():
            if verify:
                verify_checksum(path, entry.sha256, cache_dir)
            return path
    if cache_dir is None:
        raise DataUnavailable(f"data file {name!r} ({entry.relpath}) is not in the mirror {mirror} and no cache_dir "
                              f"was given to download {entry.url}{_MIRROR_HINT if mirror is None else ''}")
    target = Path(cache_dir) / entry.relpath
    try:
        def _download(tmp: Path) -> None:
            with urllib.request.urlopen(entry.url, timeout=60) as resp, open(tmp, "wb") as out:
                shutil.copyfileobj(resp, out)
        atomic_write(target, _download)
    except OSError as exc:
        raise DataUnavailable(f"data file {name!r} is not in the mirror {mirror} and downloading {entry.url} failed: "
                              f"{exc}{_MIRROR_HINT if mirror is None else ''}") from exc
    verify_checksum(target, entry.sha256, cache_dir)
    return target


def verify_checksum(path: Path, expected: str, stamp_dir: Path | None = None) -> None:
    """Check ``path``'s sha256 against ``expected``; a verified (size, mtime) stamp is
    remembered in ``stamp_dir`` so large files are hashed once.

    Raises
    ------
    ValueError
        On mismatch, naming the file and both digests.
    """
    path = Path(path)
    st = path.stat()
    stamp_key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    stamp_file = Path(stamp_dir) / "verified.json" if stamp_dir else None
    stamps: dict[str, str] = {}
    if stamp_file and stamp_file.exists():
        try:
            stamps = json.loads(stamp_file.read_text())
        except (OSError, json.JSONDecodeError):
            stamps = {}
    if stamps.get(stamp_key) == expected:
        return
    found = sha256_file(path)
    if found != expected:
        raise ValueError(f"checksum mismatch for {path}: expected sha256 {expected}, found {found}")
    if stamp_file:
        stamps[stamp_key] = expected
        atomic_write(stamp_file, lambda p: p.write_text(json.dumps(stamps, indent=1, sort_keys=True)))
