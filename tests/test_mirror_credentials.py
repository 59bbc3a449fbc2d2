"""A mirror's login is used, never written: inline in ``source.mirror`` (``http://user:password@host``),
from the environment or from a netrc file, the password reaches the HTTP mirror (which refuses
requests without it) and no file of the home, of ``PREFECT_HOME`` or of the Prefect database holds
it after a full night and an incremental one."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from fastapi.encoders import jsonable_encoder

from benchmarks.synth_dump import SAMPLE, write_mirror
from flows.corpus_build import CorpusBuildConfig
from funnelrag.config import flatten_params, redact, redact_url, split_url_credentials
from funnelrag.store import write_json
from tasks.sources.dump_source import (MIRROR_PASSWORD_ENV, MIRROR_USER_ENV, DownloadFailed, Mirror, mirror_auth,
                                      scan_days)
from tests.mirror_server import serve

WIKI, USER, PASSWORD = "synwiki", "nightly", "pl4nted-S3cret-7q"


def _login(url: str, user: str = USER, password: str = PASSWORD) -> str:
    return url.replace("http://", f"http://{user}:{password}@")


@pytest.fixture(scope="module")
def mirror(tmp_path_factory, data_mirror) -> Path:
    root = tmp_path_factory.mktemp("synth") / "mirror"
    write_mirror(root, 300, 1, seed=4, wiki=WIKI, sample=data_mirror / SAMPLE, edit_share=0.03)
    return root


def test_redaction_of_urls_in_any_value():
    assert redact_url(f"GET http://{USER}:{PASSWORD}@127.0.0.1:8/a@b then https://tok3n@h/x; mail a@b.c") == \
        "GET http://***@127.0.0.1:8/a@b then https://***@h/x; mail a@b.c"
    assert redact_url("http://u:p@ss@h/x") == "http://***@h/x"   # an unescaped @ in the password
    assert redact({"a": [f"https://u:{PASSWORD}@h", 3], "b": ("x",)}) == {"a": ["https://***@h", 3], "b": ["x"]}
    assert split_url_credentials("https://u:p%40ss@h:8/x") == ("https://h:8/x", ("u", "p@ss"))
    assert split_url_credentials("https://***@h/x") == ("https://h/x", None)   # stored redacted: no login
    assert split_url_credentials("/a/local/dir") == ("/a/local/dir", None)


def test_the_config_serializes_the_mirror_redacted(tmp_path):
    url = _login("http://127.0.0.1:8/dumps")
    cfg = CorpusBuildConfig.model_validate({"name": WIKI, "source": {"datasets": [], "wiki": WIKI, "mirror": url},
                                            "ingest": {"format": "mediawiki"}})
    assert cfg.source.mirror == url   # the flow itself still has the login
    for dumped in (cfg.model_dump(mode="json"), jsonable_encoder(cfg)):   # what Prefect stores as parameters
        assert dumped["source"]["mirror"] == "http://***@127.0.0.1:8/dumps"
    assert PASSWORD not in json.dumps(flatten_params(cfg.model_dump()))   # MLflow params
    write_json(tmp_path / "summary.json", {"config": cfg.model_dump()})
    assert PASSWORD not in (tmp_path / "summary.json").read_text()


def test_the_login_comes_from_the_url_the_environment_or_netrc(mirror, tmp_path):
    with serve(mirror, auth=(USER, PASSWORD)) as server:
        with Mirror(_login(server.url)) as m:
            assert m.root == server.url and [d.date for d in scan_days(m, WIKI, "20260101").days] == ["20260102"]
        env = {MIRROR_USER_ENV: USER, MIRROR_PASSWORD_ENV: PASSWORD}
        with Mirror(server.url, auth=mirror_auth(env)) as m:
            assert m.read_text(f"{WIKI}/20260101/dumpstatus.json")
        netrc = tmp_path / "netrc"
        netrc.write_text(f"machine 127.0.0.1 login {USER} password {PASSWORD}\n")
        with Mirror(server.url, auth=mirror_auth({"NETRC": str(netrc)})) as m:
            assert m.read_text(f"{WIKI}/20260101/dumpstatus.json")
        assert mirror_auth({"HOME": str(tmp_path / "nowhere")}) is None
        refused = server.refused
        with Mirror(_login(server.url, password="wrong-one"), retries=0) as m:
            with pytest.raises(DownloadFailed) as info:
                m.read_text(f"{WIKI}/20260101/dumpstatus.json")
        assert server.refused == refused + 1 and "401" in str(info.value) and "wrong-one" not in str(info.value)


def _secrets() -> list[bytes]:
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode())
    return [PASSWORD.encode(), basic, PASSWORD.encode("utf-16-le")]


def _files_holding_the_password(*roots: Path) -> list[str]:
    found = []
    for root in roots:
        for path in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
            data = path.read_bytes()
            if any(s in data for s in _secrets()):
                found.append(str(path))
    return found


def test_a_night_through_a_mirror_with_a_login_writes_the_password_nowhere(prefect_harness, mirror, tmp_path,
                                                                           data_mirror, monkeypatch):
    from prefect.logging.handlers import APILogHandler  # noqa: PLC0415  (heavy: prefect)
    from prefect.settings import get_current_settings  # noqa: PLC0415  (heavy: prefect)

    from flows.corpus_nightly import corpus_build_nightly  # noqa: PLC0415  (heavy: prefect flow)

    home = tmp_path / "home"

    def config(url: str) -> CorpusBuildConfig:
        return CorpusBuildConfig.model_validate({
            "name": WIKI, "source": {"datasets": [], "wiki": WIKI, "mirror": url}, "ingest": {"format": "mediawiki"},
            "clustering": {"max_tokens": 4096}, "gate": {"enabled": False},
            "runner": {"kind": "local", "workers": 2, "streams_per_piece": 2, "docs_per_shard": 50},
            "workspace": {"home": home, "data_mirror": data_mirror}})

    day = mirror / "other" / "incr" / WIKI / "20260102"
    (day / "status.txt").write_text("in-progress\n")   # night 1: the full dump only
    try:
        with serve(mirror, auth=(USER, PASSWORD)) as server:
            first = corpus_build_nightly(config(_login(server.url)))    # inline credentials
            assert first["nightly"]["action"] == "full" and first["nightly"]["mirror"] == server.url
            (day / "status.txt").write_text("done\n")
            monkeypatch.setenv(MIRROR_USER_ENV, USER)                    # from the environment
            monkeypatch.setenv(MIRROR_PASSWORD_ENV, PASSWORD)
            second = corpus_build_nightly(config(server.url))
            assert second["nightly"]["action"] == "incremental" and second["nightly"]["days"] == ["20260102"]
            assert server.refused == 0
    finally:
        (day / "status.txt").write_text("done\n")
    APILogHandler().flush()   # the run logs, into the Prefect database
    settings = get_current_settings()
    database = Path(settings.server.database.connection_url.get_secret_value().split(":///", 1)[1])
    assert database.is_file() and (home / "mlflow.db").is_file()
    checked = [home, Path(settings.home), *database.parent.glob(database.name + "*")]
    assert _files_holding_the_password(*checked) == []
    stored = b"".join(p.read_bytes() for p in database.parent.glob(database.name + "*"))
    assert f"http://***@{server.url[len('http://'):]}".encode() in stored   # the parameters, stored redacted
    summary = json.loads((Path(first["path"]) / "manifest.json").read_text())
    assert summary["config"]["source"]["mirror"] == server.url.replace("http://", "http://***@")
