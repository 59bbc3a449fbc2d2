"""FiD reader kinds (``reader.kind``): the T5 FiD and the MiniLM-warm-started BERT2BERT FiD.

Both classes share one interface (``encode``, ``forward``, ``first_token_cross_attention``,
``generate``, ``answer_labels``, ``save``, ``n_layers``, ``attn_implementation``), so training
(:mod:`tasks.funnel.reader`), Eq. 3 scoring (:mod:`tasks.funnel.attention`) and generation use
either. A reader's config dataclass carries its ``kind``, which is stored in
``reader_config.json`` and picks the class when a saved (or registered) reader is loaded.
"""
from __future__ import annotations

from typing import Any, Mapping

from models.fid import KIND as T5_KIND
from models.fid import FiDConfig, FiDReader
from models.fid_bert2bert import KIND as BERT2BERT_KIND
from models.fid_bert2bert import Bert2BertFiDConfig, Bert2BertFiDReader

CONFIGS = {T5_KIND: FiDConfig, BERT2BERT_KIND: Bert2BertFiDConfig}
ReaderConfig = FiDConfig | Bert2BertFiDConfig


def reader_config_from_dict(d: Mapping[str, Any]) -> ReaderConfig:
    """The config dataclass named by ``d["kind"]`` (``"t5"`` when absent: readers saved before
    kinds existed are T5).

    Raises
    ------
    ValueError
        Unknown kind.
    """
    kind = d.get("kind", T5_KIND)
    if kind not in CONFIGS:
        raise ValueError(f"unknown reader kind {kind!r}; known: {sorted(CONFIGS)}")
    return CONFIGS[kind](**{**d, "kind": kind})


def build_reader(cfg: ReaderConfig):
    """``(model, tokenizer)`` of the reader class for ``cfg.kind`` (``from_config``)."""
    if cfg.kind == T5_KIND:
        return FiDReader.from_config(cfg)

    return Bert2BertFiDReader.from_config(cfg)
