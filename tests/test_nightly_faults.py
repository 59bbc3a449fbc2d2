"""One bad mirror entry does not stall the nightly: a full dump said done whose files are missing or
fail their checksum is passed over (said, counted) and the days are applied on the last good base;
a day said done whose checksum list is unusable is a missing day (counted, skipped), not one that
holds itself and every later day back for ever."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.synth_dump import SAMPLE, write_mirror
from tasks.sources import dump_source as D
from tasks.sources.nightly import FULL, INCREMENTAL, plan_and_fetch, plan_night, prepare_input
from tests.mirror_server import serve

WIKI, BASE, NEWER = "synwiki", "20260101", "20260120"
DAYS = ["20260102", "20260103", "20260104"]


@pytest.fixture(scope="module")
def synth(tmp_path_factory, data_mirror) -> Path:
    root = tmp_path_factory.mktemp("synth") / "mirror"
    write_mirror(root, 300, 3, seed=5, wiki=WIKI, base_date=BASE, sample=data_mirror / SAMPLE, edit_share=0.03)
    return root


@pytest.fixture(params=["http", "directory"])
def source(request, synth, tmp_path):
    """A copy of the mirror (which a test may break) as an HTTP base URL and as a directory."""
    mirror = Path(shutil.copytree(synth, tmp_path / "mirror"))
    if request.param == "directory":
        with D.Mirror(str(mirror)) as m:
            yield m, mirror
        return
    with serve(mirror) as server, D.Mirror(server.url) as m:
        yield m, mirror


def _newer_dump(mirror: Path, files: str) -> None:
    """A full dump of ``NEWER`` whose dumpstatus.json says done: its files ``"missing"``, or copies of
    the base's with one byte changed (``"corrupt"``: the size is right, the sha1 is not)."""
    doc = json.loads((mirror / WIKI / BASE / "dumpstatus.json").read_text())
    job = doc["jobs"]["articlesmultistreamdump"]
    job["files"] = {name.replace(BASE, NEWER): f for name, f in job["files"].items()}
    newer = mirror / WIKI / NEWER
    newer.mkdir()
    (newer / "dumpstatus.json").write_text(json.dumps(doc))
    if files == "corrupt":
        for path in (mirror / WIKI / BASE).glob("*multistream*"):
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            (newer / path.name.replace(BASE, NEWER)).write_bytes(bytes(data))


@pytest.mark.parametrize("files", ["missing", "corrupt"])
def test_a_done_full_dump_with_bad_files_is_passed_over(source, tmp_path, files):
    m, mirror = source
    _newer_dump(mirror, files)
    built = {"wiki": WIKI, "base": BASE, "days": []}
    plan, path, info = plan_and_fetch(lambda unusable: plan_night(m, WIKI, built, unusable),
                                      lambda night: prepare_input(m, night, tmp_path / "downloads"))
    assert plan.action == INCREMENTAL and plan.base.date == BASE and plan.days == DAYS
    assert list(plan.unusable) == [NEWER] and f"{WIKI}-{NEWER}-pages-articles-multistream" in plan.unusable[NEWER]
    assert ("checksum mismatch" if files == "corrupt" else "not found") in plan.unusable[NEWER]
    assert f"unusable full dump(s) passed over: {NEWER}" in plan.reason
    assert plan.as_dict()["unusable_full_dumps"] == plan.unusable and info["changes_file"]

    first, path, _ = plan_and_fetch(lambda unusable: plan_night(m, WIKI, None, unusable),   # a first build
                                    lambda night: prepare_input(m, night, tmp_path / "downloads"))
    assert first.action == FULL and first.base.date == BASE and list(first.unusable) == [NEWER]
    assert path.name == f"{WIKI}-{BASE}-pages-articles-multistream.xml.bz2"


@pytest.mark.parametrize("sums", ["0123456789abcdef0123456789abcdef  ../../{name}\n", "not a checksum list\n",
                                  "xyz  {name}\n", None], ids=["dot-dot", "unparsable", "bad-md5", "absent"])
def test_a_day_with_an_unusable_checksum_list_is_missing(source, sums):
    m, mirror = source
    day = mirror / "other" / "incr" / WIKI / DAYS[1]
    if sums is None:
        (day / "md5sums.txt").unlink()
    else:
        (day / "md5sums.txt").write_text(sums.format(name=D.incr_name(WIKI, DAYS[1])))
    scan = D.scan_days(m, WIKI, BASE)
    assert [d.date for d in scan.days] == [DAYS[0], DAYS[2]] and scan.missing == [DAYS[1]] and not scan.waiting
    assert "md5sums.txt" in scan.reasons[DAYS[1]]
    plan = plan_night(m, WIKI, {"wiki": WIKI, "base": BASE, "days": [DAYS[0]]})
    assert plan.action == INCREMENTAL and plan.days == [DAYS[0], DAYS[2]] and plan.dump_entry()["missing_days"] == [DAYS[1]]
