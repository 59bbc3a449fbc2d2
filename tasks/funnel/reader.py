"""Reader training stage: (question, answers, retrieved passages) → a trained FiD reader on disk.

Pure core (no Prefect): :func:`train_reader` trains :class:`models.fid.FiDReader` through the
shared loop :func:`funnelrag.training.train` (FiD's recipe, Izacard & Grave 2021: LM loss on
the first gold answer given the top ``n_passages`` retrieved passages) and saves it with
:func:`save_reader`; :func:`load_reader` reads it back for the FunnelRAG post-ranker (Eq. 3).

Saved directory (``<train.output_dir>/reader``)::

    model.safetensors, config.json, generation_config.json   T5 weights + config (save_pretrained)
    tokenizer.json, tokenizer_config.json                    the tokenizer used in training
    reader_config.json                                       ReaderTrainConfig (FiDConfig, TrainConfig, lengths)
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import torch

from data_contracts.base import atomic_directory
from funnelrag.training import TrainConfig, TrainResult, train
from models.fid import FiDConfig, FiDReader, encode_fid_inputs

logger = logging.getLogger(__name__)

READER_DIR = "reader"
READER_CONFIG = "reader_config.json"
IGNORE_INDEX = -100  # label positions ignored by the LM loss


@dataclass(frozen=True)
class ReaderExample:
    """One training question: ``passages`` are ``(passage_id, title, text)`` in retrieval order."""

    question: str
    answers: tuple[str, ...]
    passages: tuple[tuple[str, str, str], ...]


@dataclass(frozen=True)
class ReaderTrainConfig:
    """Reader stage settings.

    fid : model settings. train : the shared loop's settings (``output_dir`` = run directory).
    n_passages : passages per question fed to FiD (the top ones; questions with fewer are skipped).
    max_passage_tokens : tokens per ``question: q title: t context: p`` pair, EOS included.
    max_answer_tokens : target tokens per answer, EOS included (longer answers are truncated).
    """

    fid: FiDConfig
    train: TrainConfig
    n_passages: int = 10
    max_passage_tokens: int = 200
    max_answer_tokens: int = 20

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ReaderTrainConfig":
        d = json.loads(text)
        return cls(fid=FiDConfig(**d.pop("fid")), train=TrainConfig(**d.pop("train")), **d)


@dataclass
class ReaderDataReport:
    """Counts of the examples kept and skipped (with reason) before training."""

    kept: int = 0
    skipped_no_answer: int = 0
    skipped_too_few_passages: int = 0
    skipped_examples: list[int] = field(default_factory=list)  # input indices


@dataclass(frozen=True)
class ReaderTrainResult:
    model_dir: Path | None  # None on non-main processes
    train: TrainResult
    report: ReaderDataReport


class ReaderHooks:
    """:class:`funnelrag.training.TrainHooks` for FiD: collate = :func:`encode_fid_inputs` +
    first-answer labels (padding → -100); loss = the model's LM loss."""

    def __init__(self, tokenizer, cfg: ReaderTrainConfig):
        self.tokenizer, self.cfg = tokenizer, cfg

    def collate(self, examples: list[ReaderExample]) -> dict[str, torch.Tensor]:
        enc = encode_fid_inputs(self.tokenizer, [e.question for e in examples],
                                [[(t, x) for _, t, x in e.passages[:self.cfg.n_passages]] for e in examples],
                                self.cfg.max_passage_tokens)
        target = self.tokenizer([e.answers[0] for e in examples], max_length=self.cfg.max_answer_tokens,
                                truncation=True, padding="longest", return_tensors="pt")
        labels = target["input_ids"].masked_fill(target["attention_mask"] == 0, IGNORE_INDEX)  # (batch, tgt_len)
        return {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask, "labels": labels}

    def loss(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        return out.loss, {"answer_tokens": float((batch["labels"] != IGNORE_INDEX).sum())}


def select_examples(examples: Sequence[ReaderExample], n_passages: int) -> tuple[list[ReaderExample], ReaderDataReport]:
    """Keep examples with an answer and at least ``n_passages`` passages, cut to the top
    ``n_passages``; the others are counted in the report (never dropped silently)."""
    report, kept = ReaderDataReport(), []
    for i, ex in enumerate(examples):
        if not ex.answers or not ex.answers[0].strip():
            report.skipped_no_answer += 1
        elif len(ex.passages) < n_passages:
            report.skipped_too_few_passages += 1
        else:
            kept.append(replace(ex, passages=tuple(ex.passages[:n_passages])))
            continue
        report.skipped_examples.append(i)
    report.kept = len(kept)
    if report.skipped_examples:
        logger.warning("reader training skips %d of %d examples (no answer: %d, < %d passages: %d)",
                       len(report.skipped_examples), len(examples), report.skipped_no_answer,
                       n_passages, report.skipped_too_few_passages)
    return kept, report


def train_reader(examples: Sequence[ReaderExample], cfg: ReaderTrainConfig, *,
                 log_metrics: Callable[[dict[str, float], int], None] | None = None,
                 resume: bool = True) -> ReaderTrainResult:
    """Train a FiD reader on ``examples`` and save it to ``<cfg.train.output_dir>/reader``.

    Raises
    ------
    ValueError
        No example is usable (all counted in the message).
    """
    kept, report = select_examples(examples, cfg.n_passages)
    if not kept:
        raise ValueError(f"no usable reader example out of {len(examples)}: {report}")
    model, tokenizer = FiDReader.from_config(cfg.fid)
    result = train(model, kept, ReaderHooks(tokenizer, cfg), cfg.train, log_metrics=log_metrics, resume=resume)
    model_dir = None
    from accelerate import PartialState  # noqa: PLC0415

    state = PartialState()
    if state.is_main_process:
        if result.full_state_dict is not None:  # ZeRO-3: the module's own parameters are partitioned
            model.load_state_dict(result.full_state_dict)
        model_dir = save_reader(model, tokenizer, cfg, Path(cfg.train.output_dir) / READER_DIR)
    state.wait_for_everyone()
    return ReaderTrainResult(model_dir=model_dir, train=result, report=report)


def save_reader(model: FiDReader, tokenizer, cfg: ReaderTrainConfig, out_dir: Path) -> Path:
    """Write weights (safetensors), T5 config, tokenizer and ``reader_config.json`` into
    ``out_dir``, which appears complete or not at all (:func:`data_contracts.base.atomic_directory`;
    an old ``out_dir`` is replaced)."""
    out_dir = Path(out_dir)
    with atomic_directory(out_dir) as tmp:
        model.t5.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / READER_CONFIG).write_text(cfg.to_json())
    logger.info("saved FiD reader to %s", out_dir)
    return out_dir


def load_reader(model_dir: str | Path) -> tuple[FiDReader, object, ReaderTrainConfig]:
    """Load a reader saved by :func:`save_reader`: ``(model in eval mode, tokenizer, config)``;
    the returned config's ``fid.base`` / ``fid.tokenizer`` point at ``model_dir``.

    Raises
    ------
    FileNotFoundError
        ``model_dir`` has no ``reader_config.json`` (not a saved reader).
    """
    model_dir = Path(model_dir)
    cfg_file = model_dir / READER_CONFIG
    if not cfg_file.exists():
        raise FileNotFoundError(f"{cfg_file} not found: {model_dir} is not a saved FiD reader")
    cfg = ReaderTrainConfig.from_json(cfg_file.read_text())
    cfg = replace(cfg, fid=replace(cfg.fid, base=str(model_dir), tokenizer=str(model_dir)))
    model, tokenizer = FiDReader.from_config(cfg.fid)
    model.eval()
    return model, tokenizer, cfg
