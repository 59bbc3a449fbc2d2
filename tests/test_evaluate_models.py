"""Model references of the evaluation: registry URIs, saved directories, clear errors."""
from __future__ import annotations

import pytest

from funnelrag.registry import parse_registry_ref
from tasks.evaluate.models import PRERANKER_FILE, ResolvedRef, resolve


def test_parse_registry_refs():
    assert parse_registry_ref("models:/funnelrag-preranker@champion") == ("funnelrag-preranker", "champion", None)
    assert parse_registry_ref("models:/funnelrag-preranker/12") == ("funnelrag-preranker", None, "12")
    for bad in ("models:/name", "models:/name/latest", "models:/@champion", "runs:/abc/model"):
        with pytest.raises(ValueError, match="models:/"):
            parse_registry_ref(bad)


def test_directory_refs_find_the_model_files(tmp_path):
    nested = tmp_path / "download" / "model"       # the registry's download layout
    nested.mkdir(parents=True)
    (nested / PRERANKER_FILE).write_text("{}")
    assert resolve(str(tmp_path / "download"), PRERANKER_FILE, tmp_path / "dl").directory == nested
    with pytest.raises(FileNotFoundError, match="reader_config.json"):
        resolve(str(tmp_path / "download"), "reader_config.json", tmp_path / "dl")
    with pytest.raises(FileNotFoundError, match="neither a built-in name"):
        resolve(str(tmp_path / "missing"), PRERANKER_FILE, tmp_path / "dl")


def test_provenance_params():
    ref = ResolvedRef("models:/p@champion", None, "p", "3", "abc")
    assert ref.as_params("preranker.distilled") == {
        "preranker.distilled.ref": "models:/p@champion", "preranker.distilled.registry_name": "p",
        "preranker.distilled.registry_version": "3", "preranker.distilled.run_id": "abc"}
    assert ResolvedRef("minilm", None).as_params("preranker.minilm") == {"preranker.minilm.ref": "minilm"}


def test_evaluate_device_setting_is_checked_and_resolved():
    """``device`` of the evaluate flow: ``auto`` resolves to what torch sees; a GPU that is not
    there is refused before anything loads."""
    import pytest
    import torch

    from flows.evaluate import EvaluateConfig
    from funnelrag.device import resolve_device

    assert EvaluateConfig().device == "auto"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees 0 GPU"):
            resolve_device("cuda:0")
