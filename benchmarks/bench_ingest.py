"""Ingest throughput on the real data (prints its figures).

* enwiki sample: MB of decompressed XML per CPU second of the whole ``ingest`` call (bz2
  decompression, XML parsing, text cleaning, link extraction, Parquet writing), i.e. per
  core, since ingest is single-threaded; plus the parts alone and mwparserfromhell's
  ``strip_code`` on the same pages for comparison (WikiExtractor is quoted at ~6.5 MB/s
  and a full mwparserfromhell parse ~1.8 MB/s).
* Wikispeedia: seconds (wall and CPU) of the full ingest (4,598 articles, 119,879 links).
* ``--scale N``: peak RSS of ingesting the enwiki sample repeated N and 3N times (renamed
  copies, plain XML) with ``shard_size=200``, and 3N times with ``shard_size=50_000`` (all
  pages in one shard), each in a fresh process: memory follows the shard size, not the dump.
* ``--piece DUMP`` (instead of the above): where a worker's time goes on one piece (``--piece-index``, 100 streams) of a
  multistream dump: CPU seconds of bz2 decompression, XML parsing, ``clean_wikitext``, the rest
  of pass 1 (titles, links, report rows) and the Parquet spill, and of the whole ``parse_piece``.

Run: ``python benchmarks/bench_ingest.py [--repeats 3] [--scale 20] [--piece DUMP.xml.bz2]``.
"""
from __future__ import annotations

import argparse
import bz2
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from funnelrag.datasets import default_mirror, resolve
from tasks.sources.ingest import IngestConfig, clean_wikitext, extract_link_targets, ingest
from tasks.sources.ingest.mediawiki import MediaWikiReader
from funnelrag.memory import status_mb


def _cpu() -> float:
    return time.process_time()


def bench_enwiki(dump: Path, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        runs = [ingest([dump], Path(tmp) / f"r{i}", IngestConfig(format="mediawiki")) for i in range(repeats)]
    mb = runs[0].uncompressed_bytes / 1e6
    best = min(r.cpu_seconds for r in runs)
    print(f"enwiki sample: {mb:.2f} MB XML, {runs[0].records} pages, {runs[0].documents} documents, "
          f"{runs[0].links} links")
    print(f"  ingest (all stages)      : {best:.3f} CPU s -> {mb / best:.2f} MB/s per core "
          f"(wall {min(r.seconds for r in runs):.3f} s; best of {repeats})")

    c0 = _cpu()
    pages = [p for p in MediaWikiReader(dump).pages()]
    parse_s = _cpu() - c0
    texts = [p.text for p in pages if p.namespace == 0 and p.redirect is None and p.text]
    text_mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    c0 = _cpu()
    for t in texts:
        clean_wikitext(t)
    clean_s = _cpu() - c0
    c0 = _cpu()
    for t in texts:
        extract_link_targets(t)
    links_s = _cpu() - c0
    print(f"  bz2 + XML parse          : {parse_s:.3f} CPU s -> {mb / parse_s:.1f} MB/s")
    print(f"  clean_wikitext           : {clean_s:.3f} CPU s -> {text_mb / clean_s:.1f} MB/s "
          f"of wikitext ({text_mb:.2f} MB)")
    print(f"  extract_link_targets     : {links_s:.3f} CPU s -> {text_mb / links_s:.1f} MB/s")
    import mwparserfromhell  # noqa: PLC0415 - reference only

    c0 = _cpu()
    for t in texts:
        mwparserfromhell.parse(t).strip_code()
    ref_s = _cpu() - c0
    print(f"  mwparserfromhell parse+strip_code (reference): {ref_s:.3f} CPU s -> {text_mb / ref_s:.2f} MB/s")


def bench_wikispeedia(articles: Path, graph: Path, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        runs = [ingest([articles, graph], Path(tmp) / f"r{i}", IngestConfig(format="wikispeedia"))
                for i in range(repeats)]
    r = min(runs, key=lambda s: s.cpu_seconds)
    print(f"wikispeedia: {r.documents} documents, {r.links} links, {r.uncompressed_bytes / 1e6:.1f} MB unpacked")
    print(f"  ingest: {r.cpu_seconds:.2f} CPU s, {r.seconds:.2f} s wall (best of {repeats}; "
          f"{r.uncompressed_bytes / 1e6 / r.cpu_seconds:.1f} MB/s per core)")


def bench_memory(dump: Path, scale: int) -> None:
    xml = bz2.decompress(dump.read_bytes())
    first, last = xml.index(b"  <page>"), xml.rindex(b"</page>") + len(b"</page>\n")
    body = xml[first:last]
    with tempfile.TemporaryDirectory() as tmp:
        for copies, shard_size in ((scale, 200), (3 * scale, 200), (3 * scale, 50_000)):
            big = Path(tmp) / f"scaled{copies}.xml"
            if not big.exists():
                with open(big, "wb") as fh:
                    fh.write(xml[:first])
                    for k in range(copies):
                        suffix = b" " + str(k).encode()
                        fh.write(re.sub(rb"<title>([^<]*)</title>", rb"<title>\1" + suffix + rb"</title>", body))
                    fh.write(xml[last:])
            size = big.stat().st_size / 1e6
            out = subprocess.run([sys.executable, __file__, "--child", str(big), str(shard_size), str(Path(tmp) / "o")],
                                 check=True, capture_output=True, text=True).stdout
            r = json.loads(out)
            print(f"memory: {size:4.0f} MB XML ({copies:3d}x sample, {r['documents']} documents), "
                  f"shard_size={shard_size:>6}: peak RSS {r['rss_mb']:.0f} MB, {r['shards']} shards, "
                  f"{r['cpu']:.1f} CPU s ({size / r['cpu']:.2f} MB/s)")


def bench_piece(dump: Path, index: int, repeats: int) -> None:
    from tasks.sources.ingest import parallel  # noqa: PLC0415
    from tasks.sources.ingest.multistream import open_piece, plan_layout  # noqa: PLC0415
    from tasks.sources.ingest.shards import ShardWriter  # noqa: PLC0415

    layout = plan_layout(dump, 100)
    namespaces, _ = parallel.read_siteinfo(layout)
    piece = layout.pieces[index]
    cfg = IngestConfig(format="mediawiki")
    parts: dict[str, float] = {}

    def best(name: str, fn):
        times = []
        for _ in range(repeats):
            c0 = _cpu()
            out = fn()
            times.append(_cpu() - c0)
        parts[name] = min(times)
        return out

    xml = best("bz2 decompression", lambda: open_piece(dump, piece.start, piece.end).read())
    pages = best("bz2 + XML parse (MediaWikiReader)",
                 lambda: list(MediaWikiReader(dump, lambda: open_piece(dump, piece.start, piece.end)).pages()))
    texts = [p.text for p in pages if p.namespace == 0 and p.redirect is None and p.text]
    best("clean_wikitext", lambda: [clean_wikitext(t) for t in texts])
    with tempfile.TemporaryDirectory() as tmp:
        def pass1():
            state = parallel._pass_class()(cfg, ShardWriter(Path(tmp), cfg.shard_size))
            for page in pages:
                state.process(page, namespaces)
            return state
        state = best("pass 1 on parsed pages (clean, titles, links, rows)", pass1)
        rows = list(state.shards._rows)

        def spill():
            state.shards._rows = list(rows)
            state.shards.paths = []
            state.shards.flush()
        best("Parquet spill (sort, to Arrow, write)", spill)
        best("parse_piece (all of it)", lambda: parallel.parse_piece(str(dump), piece, namespaces, cfg, tmp + "/p"))
    mb = len(xml) / 1e6
    print(f"piece {index} of {dump.name}: {mb:.1f} MB XML, {len(pages)} pages, {len(texts)} articles "
          f"(CPU s, best of {repeats})")
    for name, seconds in parts.items():
        print(f"  {name:55s}: {seconds:6.3f} CPU s -> {mb / seconds:6.1f} MB XML/s")


def _child(path: str, shard_size: str, out: str) -> None:
    s = ingest([Path(path)], Path(out), IngestConfig(format="mediawiki", shard_size=int(shard_size)))
    rss_mb = status_mb("VmHWM")   # this process image's peak (ru_maxrss would carry the parent's over execve)
    print(json.dumps({"rss_mb": rss_mb, "shards": s.shards, "cpu": s.cpu_seconds, "documents": s.documents}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale", type=int, default=0, help="also measure peak RSS on the sample repeated N times")
    parser.add_argument("--piece", type=Path, help="also break down one piece of this multistream dump")
    parser.add_argument("--piece-index", type=int, default=3)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return
    if args.piece:
        bench_piece(args.piece, args.piece_index, args.repeats)
        return
    mirror = default_mirror()
    if mirror is None:
        sys.exit("no data mirror (../shared/data) found")
    dump = resolve("enwiki-sample", mirror)
    bench_enwiki(dump, args.repeats)
    bench_wikispeedia(resolve("wikispeedia-articles", mirror), resolve("wikispeedia-graph", mirror), args.repeats)
    if args.scale:
        bench_memory(dump, args.scale)


if __name__ == "__main__":
    main()
