"""Synthetic MediaWiki dump generator: a ``pages-articles-multistream.xml.bz2`` and its
``-index.txt.bz2``, shaped like the English Wikipedia dump, to measure the corpus build at scale.

Layout, as Wikimedia ships it: stream 0 holds ``<mediawiki>`` and ``<siteinfo>``; then one bz2
stream per :data:`PAGES_PER_STREAM` pages (bare ``<page>`` elements); a last stream holds
``</mediawiki>``. The index has one line ``offset:page_id:title`` per page, ``offset`` being the
byte offset of the page's stream in the ``.bz2`` file.

Proportions (enwiki pages-articles, 2024: ~6.9M articles, ~11M main-namespace redirects, ~6M
pages of other namespaces, ~5% of articles are disambiguation pages):
:data:`KIND_SHARES`. Article wikitext lengths are log-normal; the spread (sigma of log bytes) is
fitted to the articles of the shared enwiki sample (``fit_lengths``: 1.32), the location is set
so that the mean is enwiki's ~11.7 KB per article (95 GB of XML over ~24M pages, most of it in
articles), since the sample holds the first, longest articles of the dump (median 41.7 KB).
Words are drawn with the word frequencies of the sample's cleaned text (Zipf-like); link
targets follow a power law (article of popularity rank ``n * u**3``), one link per ~200 bytes
as in the sample, 8% of links through a redirect title, 4% to missing pages; infoboxes,
references, headings and categories as in real wikitext.

Deterministic from ``seed``: every stream is generated from its own ``(seed, stream)`` random
generator, so the bytes do not depend on ``workers``.

Run: ``python benchmarks/synth_dump.py OUT_DIR --pages 1000000 [--seed 0] [--workers 2]``.
"""
from __future__ import annotations

import argparse
import bz2
import hashlib
import json
import multiprocessing as mp
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import numpy as np

PAGES_PER_STREAM = 100
ARTICLE, REDIRECT, DISAMBIGUATION, OTHER = 0, 1, 2, 3
KIND_SHARES = (0.275, 0.46, 0.015, 0.25)
"""Share of pages per kind: articles, main-namespace redirects, disambiguation pages, other namespaces."""
OTHER_NAMESPACES = ((14, "Category", 0.42), (6, "File", 0.16), (10, "Template", 0.14), (4, "Wikipedia", 0.22),
                    (100, "Portal", 0.03), (118, "Draft", 0.02), (828, "Module", 0.01))
LENGTH_SIGMA = 1.32                            # fitted to the enwiki sample's articles (log bytes)
LENGTH_MU = float(np.log(11_700) - LENGTH_SIGMA ** 2 / 2)   # mean article = 11.7 KB
BYTES_PER_LINK = 200
SAMPLE = "enwiki-sample/enwiki-20160501-pages-articles-shortened.xml.bz2"
HEADER = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10" xml:lang="en">
  <siteinfo>
    <sitename>Wikipedia</sitename>
    <dbname>enwiki</dbname>
    <case>first-letter</case>
    <namespaces>
      <namespace key="0" case="first-letter" />
{namespaces}
    </namespaces>
  </siteinfo>
"""
FOOTER = "</mediawiki>\n"


@dataclass
class Plan:
    """Everything shared by the streams: page kinds, titles and the word distribution."""

    seed: int
    kinds: np.ndarray          # (n_pages,) int8
    namespaces: np.ndarray     # (n_pages,) int16 namespace id (0 for main)
    title_words: np.ndarray    # (n_pages, 2) int32 word ids
    articles: np.ndarray       # page indices of the articles, in popularity order
    redirects: np.ndarray      # page indices of the main-namespace redirects
    vocab: np.ndarray          # (V,) object: words
    cum: np.ndarray            # (V,) cumulative word probabilities

    def title(self, i: int) -> str:
        a, b = self.title_words[i]
        base = f"{self.vocab[a].capitalize()} {self.vocab[b]} {np.base_repr(i, 36).lower()}"
        if self.kinds[i] == DISAMBIGUATION:
            return f"{base} (disambiguation)"
        ns = int(self.namespaces[i])
        return f"{_NS_NAMES[ns]}:{base}" if ns else base


_NS_NAMES = {ns: name for ns, name, _ in OTHER_NAMESPACES}


def sample_words(sample: Path, max_words: int = 30_000) -> tuple[np.ndarray, np.ndarray]:
    """Words and frequencies of the cleaned article text of a real dump (the shared sample)."""
    from tasks.sources.ingest import clean_wikitext  # noqa: PLC0415

    text = bz2.open(sample).read().decode("utf-8")
    counts: Counter[str] = Counter()
    for body in re.findall(r"<text[^>]*>(.*?)</text>", text, re.S):
        if not body.lstrip().upper().startswith("#REDIRECT"):
            counts.update(w for w in clean_wikitext(_unescape(body)).split() if w.isalpha())
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:max_words]
    words = np.array([w for w, _ in top], dtype=object)
    freq = np.array([c for _, c in top], dtype=np.float64)
    return words, freq / freq.sum()


def fit_lengths(sample: Path) -> tuple[float, float]:
    """``(mu, sigma)`` of log wikitext bytes of the sample's main-namespace articles."""
    text = bz2.open(sample).read().decode("utf-8")
    sizes = [len(_unescape(m.group(2)).encode()) for m in re.finditer(r"<ns>(\d+)</ns>.*?<text[^>]*>(.*?)</text>", text, re.S)
             if m.group(1) == "0" and not m.group(2).lstrip().upper().startswith("#REDIRECT")]
    logs = np.log(np.array(sizes, dtype=np.float64))
    return float(logs.mean()), float(logs.std())


def _unescape(s: str) -> str:
    return s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")


def make_plan(n_pages: int, seed: int, words: np.ndarray, freq: np.ndarray) -> Plan:
    """Page kinds, namespaces, titles and article popularity order for ``n_pages`` pages."""
    rng = np.random.default_rng([seed, 0xD0])
    kinds = rng.choice(4, size=n_pages, p=KIND_SHARES).astype(np.int8)
    if n_pages and not (kinds == ARTICLE).any():
        kinds[0] = ARTICLE
    ns_ids = np.array([ns for ns, _, _ in OTHER_NAMESPACES], dtype=np.int16)
    ns_p = np.array([p for _, _, p in OTHER_NAMESPACES])
    namespaces = np.where(kinds == OTHER, rng.choice(ns_ids, size=n_pages, p=ns_p / ns_p.sum()), 0).astype(np.int16)
    title_words = rng.choice(len(words), size=(n_pages, 2), p=freq).astype(np.int32)
    articles = rng.permutation(np.flatnonzero(kinds == ARTICLE))
    return Plan(seed, kinds, namespaces, title_words, articles, np.flatnonzero(kinds == REDIRECT), words, np.cumsum(freq))


def _popular(plan: Plan, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` article page indices drawn from a power law over popularity ranks."""
    ranks = (plan.articles.size * rng.random(n) ** 3).astype(np.int64)
    return plan.articles[np.minimum(ranks, plan.articles.size - 1)]


def _words(plan: Plan, rng: np.random.Generator, n: int) -> list[str]:
    idx = np.minimum(np.searchsorted(plan.cum, rng.random(n)), plan.vocab.size - 1)
    return plan.vocab[idx].tolist()


def article_text(plan: Plan, rng: np.random.Generator, i: int, n_bytes: int) -> str:
    """Wikitext of about ``n_bytes`` bytes: infobox, lead, sections, links, references, categories."""
    n_words = max(20, n_bytes // 7)
    words = _words(plan, rng, n_words)
    n_links = max(1, n_bytes // BYTES_PER_LINK)
    pos = rng.choice(n_words, size=min(n_links, n_words), replace=False)
    targets = _popular(plan, rng, pos.size)
    fate = rng.random(pos.size)
    for p, t, f in zip(pos.tolist(), targets.tolist(), fate.tolist()):
        if f < 0.04:
            words[p] = f"[[{plan.vocab[int(t) % plan.vocab.size].capitalize()} missing {t}]]"
        elif f < 0.12 and plan.redirects.size:
            words[p] = f"[[{plan.title(int(plan.redirects[int(t) % plan.redirects.size]))}|{words[p]}]]"
        elif f < 0.55:
            words[p] = f"[[{plan.title(int(t))}|{words[p]}]]"
        else:
            words[p] = f"[[{plan.title(int(t))}]]"
    for p in range(150, n_words, 150):
        words[p] += f"<ref>{{{{cite web |title={words[p - 1]} |url=https://example.org/{i}/{p}}}}}</ref>"
    for p in range(300, n_words, 300):
        words[p] = f"\n\n== {words[p].capitalize()} {words[p - 1]} ==\n{words[p]}"
    title = plan.title(i)
    infobox = f"{{{{Infobox thing\n| name = {title}\n| field = {words[0]}\n}}}}\n" if i % 2 else ""
    cats = "\n".join(f"[[Category:{w.capitalize()}]]" for w in _words(plan, rng, 1 + i % 4))
    return f"{infobox}'''{title}''' {' '.join(words)}.\n\n{cats}\n"


def page_xml(plan: Plan, rng: np.random.Generator, i: int) -> str:
    """One ``<page>`` element (4-space indented like the real dump)."""
    kind, title = int(plan.kinds[i]), plan.title(i)
    redirect = ""
    if kind == REDIRECT:
        target = plan.title(int(_popular(plan, rng, 1)[0]))
        text, redirect = f"#REDIRECT [[{target}]]\n\n{{{{R from alternative name}}}}", f"\n    <redirect title={quoteattr(target)} />"
    elif kind == DISAMBIGUATION:
        items = "\n".join(f"* [[{plan.title(int(t))}]]" for t in _popular(plan, rng, 2 + int(rng.integers(8))))
        text = f"'''{title[:-17]}''' may refer to:\n{items}\n\n{{{{disambiguation}}}}"
    elif kind == OTHER:
        text = " ".join(_words(plan, rng, max(5, int(rng.lognormal(6.0, 1.2)) // 7)))
    else:
        size = int(np.clip(rng.lognormal(LENGTH_MU, LENGTH_SIGMA), 300, 2_000_000))
        text = article_text(plan, rng, i, size)
    sha = hashlib.sha1(text.encode()).hexdigest()
    return (f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{int(plan.namespaces[i])}</ns>\n"
            f"    <id>{i + 10}</id>{redirect}\n    <revision>\n      <id>{1_000_000 + i}</id>\n"
            f"      <timestamp>2026-01-01T00:00:00Z</timestamp>\n      <contributor>\n        <username>Synth</username>\n"
            f"        <id>1</id>\n      </contributor>\n      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
            f"      <text bytes=\"{len(text.encode())}\" xml:space=\"preserve\">{escape(text)}</text>\n"
            f"      <sha1>{sha}</sha1>\n    </revision>\n  </page>\n")


_PLAN: Plan | None = None


def _init(plan: Plan) -> None:
    global _PLAN
    _PLAN = plan


def stream_block(stream: int) -> tuple[bytes, int, list[tuple[int, str]]]:
    """``(bz2 stream, XML bytes, [(page_id, title)])`` of pages ``stream*100 .. +99``."""
    plan = _PLAN
    rng = np.random.default_rng([plan.seed, stream])
    lo, hi = stream * PAGES_PER_STREAM, min((stream + 1) * PAGES_PER_STREAM, plan.kinds.size)
    xml = "".join(page_xml(plan, rng, i) for i in range(lo, hi)).encode("utf-8")
    return bz2.compress(xml, 9), len(xml), [(i + 10, plan.title(i)) for i in range(lo, hi)]


def write_dump(out_dir: Path, n_pages: int, seed: int = 0, workers: int = 1, sample: Path | None = None,
               name: str = "synwiki-20260101-pages-articles-multistream") -> dict:
    """Write ``<name>.xml.bz2`` and ``<name>-index.txt.bz2`` into ``out_dir``.

    Returns ``{"dump", "index", "pages", "streams", "xml_bytes", "bz2_bytes", "seconds"}``.
    Raises ``FileNotFoundError`` when the word sample (the shared enwiki sample) is missing.
    """
    from funnelrag.datasets import default_mirror  # noqa: PLC0415

    t0 = time.perf_counter()
    sample = Path(sample) if sample else Path(default_mirror()) / SAMPLE
    if not sample.is_file():
        raise FileNotFoundError(f"synthetic dump: word sample {sample} not found")
    words, freq = sample_words(sample)
    plan = make_plan(n_pages, seed, words, freq)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dump, index = out_dir / f"{name}.xml.bz2", out_dir / f"{name}-index.txt.bz2"
    ns_lines = "\n".join(f'      <namespace key="{ns}" case="first-letter">{nm}</namespace>' for ns, nm, _ in OTHER_NAMESPACES)
    head = HEADER.format(namespaces=ns_lines).encode()
    n_streams = -(-n_pages // PAGES_PER_STREAM)
    xml_bytes = len(head) + len(FOOTER)
    with open(dump, "wb") as fh, bz2.open(index, "wt", encoding="utf-8") as ix:
        fh.write(bz2.compress(head, 9))
        ctx = mp.get_context("fork")
        pool = ctx.Pool(workers, initializer=_init, initargs=(plan,)) if workers > 1 else None
        _init(plan)
        blocks = pool.imap(stream_block, range(n_streams), chunksize=4) if pool else map(stream_block, range(n_streams))
        try:
            for data, n_xml, pages in blocks:
                offset = fh.tell()
                fh.write(data)
                xml_bytes += n_xml
                ix.writelines(f"{offset}:{pid}:{title}\n" for pid, title in pages)
        finally:
            if pool:
                pool.close()
                pool.join()
        fh.write(bz2.compress(FOOTER.encode(), 9))
    return {"dump": str(dump), "index": str(index), "pages": n_pages, "streams": n_streams, "xml_bytes": xml_bytes,
            "bz2_bytes": dump.stat().st_size, "seconds": time.perf_counter() - t0}


def repack(xml: bytes, dump: Path, pages_per_stream: int = PAGES_PER_STREAM, index: bool = True) -> int:
    """Re-pack a single-stream dump's XML as a multistream ``.xml.bz2`` (+ index unless ``index``
    is False); returns the number of page streams. Pages are cut at ``<page>`` lines."""
    start, end = xml.index(b"  <page>"), xml.rindex(b"</mediawiki>")
    pages = [b"  <page>" + p for p in xml[start:end].split(b"  <page>")[1:]]
    dump = Path(dump)
    lines: list[str] = []
    with open(dump, "wb") as fh:
        fh.write(bz2.compress(xml[:start], 9))
        for k in range(0, len(pages), pages_per_stream):
            offset = fh.tell()
            block = pages[k:k + pages_per_stream]
            fh.write(bz2.compress(b"".join(block), 9))
            for p in block:
                m = re.search(rb"<title>(.*?)</title>.*?<id>(\d+)</id>", p, re.S)
                lines.append(f"{offset}:{m.group(2).decode() if m else 0}:{m.group(1).decode() if m else ''}\n")
        fh.write(bz2.compress(xml[end:], 9))
    if index:
        with bz2.open(dump.with_name(dump.name[: -len(".xml.bz2")] + "-index.txt.bz2"), "wt", encoding="utf-8") as ix:
            ix.writelines(lines)
    return -(-len(pages) // pages_per_stream)


# ---------------------------------------------------------------------------------- Wikimedia mirror
INCR_HEADER = ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11" xml:lang="en">\n'
               "  <siteinfo>\n    <sitename>Wikipedia</sitename>\n    <dbname>{wiki}</dbname>\n  </siteinfo>\n")


def _day(date: str, k: int) -> str:
    import datetime as dt

    return (dt.datetime.strptime(date, "%Y%m%d") + dt.timedelta(days=k)).strftime("%Y%m%d")


def _digests(path: Path) -> dict:
    sha1, md5 = hashlib.sha1(), hashlib.md5()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            sha1.update(block)
            md5.update(block)
    return {"size": path.stat().st_size, "sha1": sha1.hexdigest(), "md5": md5.hexdigest()}


def write_dumpstatus(dump_dir: Path, wiki: str, date: str, status: str = "done") -> Path:
    """``dumpstatus.json`` (job ``articlesmultistreamdump`` with size, sha1, md5 and url of the dump
    and its index), ``<wiki>-<date>-sha1sums.txt`` and ``-md5sums.txt`` of a full-dump directory."""
    import json

    files = {}
    for name in (f"{wiki}-{date}-pages-articles-multistream.xml.bz2", f"{wiki}-{date}-pages-articles-multistream-index.txt.bz2"):
        files[name] = {**_digests(dump_dir / name), "url": f"/{wiki}/{date}/{name}"}
    status_doc = {"jobs": {"articlesmultistreamdump": {"status": status, "updated": f"{date[:4]}-{date[4:6]}-{date[6:]} 12:00:00",
                                                       "files": files},
                           "metacurrentdump": {"status": "waiting", "updated": "", "files": {}}},
                  "version": "0.8"}
    (dump_dir / f"{wiki}-{date}-sha1sums.txt").write_text("".join(f"{f['sha1']}  {n}\n" for n, f in files.items()))
    (dump_dir / f"{wiki}-{date}-md5sums.txt").write_text("".join(f"{f['md5']}  {n}\n" for n, f in files.items()))
    path = dump_dir / "dumpstatus.json"
    path.write_text(json.dumps(status_doc, indent=1, sort_keys=True))
    return path


@dataclass
class SynthPage:
    """A page's state after an adds-changes day (what a full dump of that day would hold)."""

    page_id: int
    title: str
    ns: int
    redirect: str | None
    text: str
    rev_id: int
    timestamp: str


def synth_page_xml(p: SynthPage, revisions: list[tuple[int, str, str]] | None = None) -> str:
    """A ``<page>`` with one revision (a full dump) or several (``revisions``: (id, timestamp,
    text) of an adds-changes file, the last being the page's state)."""
    revs = revisions or [(p.rev_id, p.timestamp, p.text)]
    body = "".join(
        f"    <revision>\n      <id>{rid}</id>\n      <timestamp>{ts}</timestamp>\n      <contributor>\n"
        f"        <username>Synth</username>\n        <id>2</id>\n      </contributor>\n      <model>wikitext</model>\n"
        f"      <format>text/x-wiki</format>\n      <text bytes=\"{len(t.encode())}\" xml:space=\"preserve\">{escape(t)}</text>\n"
        f"      <sha1>{hashlib.sha1(t.encode()).hexdigest()}</sha1>\n    </revision>\n" for rid, ts, t in revs)
    redirect = f"\n    <redirect title={quoteattr(p.redirect)} />" if p.redirect is not None else ""
    return (f"  <page>\n    <title>{escape(p.title)}</title>\n    <ns>{p.ns}</ns>\n    <id>{p.page_id}</id>{redirect}\n"
            f"{body}  </page>\n")


def write_days(root: Path, plan: Plan, wiki: str, base_date: str, n_days: int, seed: int,
               edit_share: float = 0.01, new_share: float = 0.001, redirect_share: float = 0.0005,
               not_done: int = 0) -> tuple[dict[int, SynthPage], list[dict]]:
    """Adds-changes days ``base_date + 1 … + n_days`` under ``root/other/incr/<wiki>/``: each
    edits ~``edit_share`` of all pages (1–3 revisions each, the last one wins; ~5% of edited
    articles renamed (at least one a day), ~2% turned into redirects; edits of pages in other namespaces too), adds
    ~``new_share`` new articles and ~``redirect_share`` new redirects (page ids after the last
    one). The last ``not_done`` days get ``status.txt`` = "in-progress".

    Returns ``({page_id: final state of every ns-0 page changed or added}, [per-day counts])``.
    """
    n = plan.kinds.size
    final: dict[int, SynthPage] = {}
    titles = {}   # page id -> current title of pages renamed or added
    next_id, rev = n + 10, 10_000_000
    infos = []
    for d in range(1, n_days + 1):
        date = _day(base_date, d)
        rng = np.random.default_rng([seed, 0xDA, d])
        ts = f"{date[:4]}-{date[4:6]}-{date[6:]}T06:00:00Z"
        n_edit = max(1, int(round(edit_share * (next_id - 10))))
        edited = np.unique(rng.integers(10, next_id, size=n_edit)).tolist()
        pages_out: list[str] = []
        counts = Counter()
        for pid in edited:
            i = pid - 10
            prev = final.get(pid)
            kind = int(plan.kinds[i]) if i < n else ARTICLE
            ns = int(plan.namespaces[i]) if i < n else 0
            title = titles.get(pid) or (plan.title(i) if i < n else prev.title)
            revisions = []
            for r in range(1 + int(rng.integers(3))):
                rev += 1
                if ns != 0:
                    text = " ".join(_words(plan, rng, 30 + int(rng.integers(200))))
                elif kind == REDIRECT or (prev is not None and prev.redirect is not None):
                    target = plan.title(int(_popular(plan, rng, 1)[0]))
                    text = f"#REDIRECT [[{target}]]"
                elif kind == DISAMBIGUATION:
                    items = "\n".join(f"* [[{plan.title(int(t))}]]" for t in _popular(plan, rng, 2 + int(rng.integers(8))))
                    text = f"'''{title[:-17]}''' may refer to:\n{items}\n\n{{{{disambiguation}}}}"
                else:
                    size = int(np.clip(rng.lognormal(LENGTH_MU, LENGTH_SIGMA), 300, 200_000))
                    text = article_text(plan, rng, i if i < n else int(rng.integers(n)), size)
                revisions.append((rev, ts, text))
            redirect = None
            text = revisions[-1][2]
            if ns == 0 and kind == ARTICLE and rng.random() < 0.02:   # the page became a redirect
                target = plan.title(int(_popular(plan, rng, 1)[0]))
                rev += 1
                text = f"#REDIRECT [[{target}]]"
                revisions.append((rev, ts, text))
            if text.startswith("#REDIRECT [["):
                redirect = text[len("#REDIRECT [["):text.index("]]")]
            if ns == 0 and kind == ARTICLE and redirect is None and (rng.random() < 0.05 or not counts["renamed"]):   # renamed
                title = f"{title} (renamed {date})"
                titles[pid] = title
                counts["renamed"] += 1
            page = SynthPage(pid, title, ns, redirect, text, revisions[-1][0], ts)
            pages_out.append(synth_page_xml(page, revisions))
            counts["edited" if ns == 0 else "other_namespace"] += 1
            if ns == 0:
                final[pid] = page
        for kind_new, share in ((ARTICLE, new_share), (REDIRECT, redirect_share)):
            for _ in range(int(round(share * n))):
                pid, next_id = next_id, next_id + 1
                rev += 1
                a, b = plan.vocab[int(rng.integers(plan.vocab.size))], plan.vocab[int(rng.integers(plan.vocab.size))]
                title = f"{a.capitalize()} {b} new {pid}"
                if kind_new == ARTICLE:
                    text = article_text(plan, rng, int(rng.integers(n)), int(np.clip(rng.lognormal(LENGTH_MU, LENGTH_SIGMA), 300, 200_000)))
                    redirect = None
                    counts["new_articles"] += 1
                else:
                    redirect = plan.title(int(_popular(plan, rng, 1)[0]))
                    text = f"#REDIRECT [[{redirect}]]"
                    counts["new_redirects"] += 1
                page = SynthPage(pid, title, 0, redirect, text, rev, ts)
                titles[pid] = title
                final[pid] = page
                pages_out.append(synth_page_xml(page))
        day_dir = root / "other" / "incr" / wiki / date
        day_dir.mkdir(parents=True, exist_ok=True)
        name = f"{wiki}-{date}-pages-meta-hist-incr.xml.bz2"
        (day_dir / name).write_bytes(bz2.compress((INCR_HEADER.format(wiki=wiki) + "".join(pages_out) + FOOTER).encode(), 9))
        (day_dir / "md5sums.txt").write_text(f"{_digests(day_dir / name)['md5']}  {name}\n")
        (day_dir / "maxrevid.txt").write_text(f"{rev}\n")
        (day_dir / "status.txt").write_text("in-progress\n" if d > n_days - not_done else "done\n")
        infos.append({"date": date, **counts})
    return final, infos


def write_merged(base_dump: Path, final: dict[int, SynthPage], out: Path) -> dict:
    """A full multistream dump (+ index) holding the base dump's pages with every ns-0 change of
    ``final`` (the page texts after the last day), in page id order, :data:`PAGES_PER_STREAM`
    pages a stream: what a full dump of that day would hold, to check an incremental build
    against. Other-namespace edits are not applied (the nightly skips them too)."""
    xml = bz2.open(base_dump).read()
    start, end = xml.index(b"  <page>"), xml.rindex(b"</mediawiki>")
    pages = []
    for body in xml[start:end].split(b"  <page>")[1:]:
        pid = int(re.search(rb"<id>(\d+)</id>", body).group(1))
        pages.append((pid, synth_page_xml(final[pid]).encode() if pid in final else b"  <page>" + body))
    seen = {pid for pid, _ in pages}
    pages += [(pid, synth_page_xml(p).encode()) for pid, p in sorted(final.items()) if pid not in seen]
    pages.sort(key=lambda t: t[0])
    merged = xml[:start] + b"".join(body for _, body in pages) + xml[end:]
    out.parent.mkdir(parents=True, exist_ok=True)
    streams = repack(merged, out)
    return {"dump": str(out), "pages": len(pages), "streams": streams}


def write_mirror(root: Path, n_pages: int, n_days: int = 3, seed: int = 0, workers: int = 1, wiki: str = "synwiki",
                 base_date: str = "20260101", merged: Path | None = None, sample: Path | None = None,
                 reuse_base: bool = False, not_done: int = 0, edit_share: float = 0.01) -> dict:
    """A mirror in Wikimedia's layout under ``root``: the full dump ``<wiki>/<base_date>/`` (dump,
    index, ``dumpstatus.json``, sha1/md5 sums) and ``n_days`` adds-changes days
    ``other/incr/<wiki>/<date>/`` (:func:`write_days`); with ``merged``, also the full dump of the
    last day's page texts written there (:func:`write_merged`), outside the mirror.
    ``reuse_base`` keeps a base dump already written by this function or :func:`write_dump`."""
    t0 = time.perf_counter()
    root = Path(root)
    dump_dir = root / wiki / base_date
    name = f"{wiki}-{base_date}-pages-articles-multistream"
    sample = Path(sample) if sample else None
    if not (reuse_base and (dump_dir / f"{name}-index.txt.bz2").is_file()):
        write_dump(dump_dir, n_pages, seed, workers, sample, name=name)
    write_dumpstatus(dump_dir, wiki, base_date)
    from funnelrag.datasets import default_mirror

    words, freq = sample_words(sample or Path(default_mirror()) / SAMPLE)
    plan = make_plan(n_pages, seed, words, freq)
    final, days = write_days(root, plan, wiki, base_date, n_days, seed, edit_share=edit_share, not_done=not_done)
    info = {"mirror": str(root), "base": str(dump_dir / f"{name}.xml.bz2"), "days": days}
    if merged is not None:
        last = _day(base_date, n_days - not_done)
        info["merged"] = write_merged(dump_dir / f"{name}.xml.bz2", final,
                                      Path(merged) / f"{wiki}-{last}-pages-articles-multistream.xml.bz2")
    info["seconds"] = time.perf_counter() - t0
    return info


def synthetic_arguments(doc: str, pages: int, workers: int) -> argparse.ArgumentParser:
    """The command line of a script that writes a synthetic dump or mirror and works on it.

    Parameters
    ----------
    doc : str
        The script's module docstring; its first paragraph becomes the description.
    pages : int
        Default of ``--pages``, the synthetic dump's page count.
    workers : int
        Default of ``--workers``, the processes that write the dump (and build from it).

    Returns
    -------
    argparse.ArgumentParser
        With ``out_dir`` (positional), ``--pages``, ``--seed`` (default 0: the same command gives
        the same dump) and ``--workers``; the script adds its own arguments.
    """
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--pages", type=int, default=pages)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=workers)
    return ap


def main() -> None:
    ap = synthetic_arguments(__doc__, pages=10_000, workers=1)
    ap.add_argument("--mirror-days", type=int, default=0,
                    help="write a Wikimedia-layout mirror in OUT_DIR: the full dump and this many adds-changes days")
    ap.add_argument("--merged", type=Path, help="with --mirror-days: write the full dump of the last day's texts here")
    ap.add_argument("--reuse-base", action="store_true", help="with --mirror-days: keep an existing base dump")
    args = ap.parse_args()
    if args.mirror_days:
        info = write_mirror(args.out_dir, args.pages, args.mirror_days, args.seed, args.workers, merged=args.merged,
                            reuse_base=args.reuse_base)
        print(json.dumps(info, indent=1))
        return
    info = write_dump(args.out_dir, args.pages, args.seed, args.workers)
    print(f"{info['pages']:,} pages, {info['streams']:,} streams: {info['xml_bytes'] / 1e6:.1f} MB XML, "
          f"{info['bz2_bytes'] / 1e6:.1f} MB bz2 in {info['seconds']:.1f} s -> {info['dump']}")


if __name__ == "__main__":
    main()
