"""Reader training stage: (question, answers, retrieved passages) → a trained FiD reader on disk.

Pure core (no Prefect): :func:`train_reader` trains :class:`models.fid.FiDReader` through the
shared loop :func:`funnelrag.training.train` (FiD's recipe, Izacard & Grave 2021: LM loss on
the first gold answer given the top ``n_passages`` retrieved passages) and saves it with
:func:`save_reader`; :func:`load_reader` reads it back for the FunnelRAG post-ranker (Eq. 3).

Saved directory (``<train.output_dir>/reader``)::

    model.safetensors, config.json, ...   weights + config (save_pretrained of the T5 or the
                                          BERT2BERT encoder-decoder, by ``fid.kind``)
    tokenizer.json, tokenizer_config.json the tokenizer used in training
    reader_config.json                    ReaderTrainConfig (reader config with its kind, TrainConfig, lengths)
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import torch

from data_contracts.base import atomic_directory
from funnelrag.training import TrainConfig, TrainResult, load_checkpoint_weights, load_full_state_dict, train
from models.fid import encode_fid_inputs, t5_answer_labels
from models.readers import ReaderConfig, build_reader, reader_config_from_dict

logger = logging.getLogger(__name__)

READER_DIR = "reader"
READER_CONFIG = "reader_config.json"


@dataclass(frozen=True)
class ReaderExample:
    """One training question: ``passages`` are ``(passage_id, title, text)`` in retrieval order."""

    question: str
    answers: tuple[str, ...]
    passages: tuple[tuple[str, str, str], ...]


@dataclass(frozen=True)
class ReaderTrainConfig:
    """Reader stage settings.

    fid : reader settings; its ``kind`` (``"t5"`` or ``"minilm-bert2bert"``) picks the class. train : the shared loop's settings (``output_dir`` = run directory).
    n_passages : passages per question fed to FiD (the top ones; questions with fewer are skipped).
    max_passage_tokens : tokens per ``question: q title: t context: p`` pair, EOS included.
    max_answer_tokens : target tokens per answer, EOS included (longer answers are truncated).
    """

    fid: ReaderConfig
    train: TrainConfig
    n_passages: int = 10
    max_passage_tokens: int = 200
    max_answer_tokens: int = 20

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ReaderTrainConfig":
        d = json.loads(text)
        return cls(fid=reader_config_from_dict(d.pop("fid")), train=TrainConfig(**d.pop("train")), **d)


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
    first-answer labels (the reader's ``answer_labels``, default T5's; padding → -100); loss = the
    model's LM loss."""

    def __init__(self, tokenizer, cfg: ReaderTrainConfig, answer_labels: Callable = t5_answer_labels):
        self.tokenizer, self.cfg, self.answer_labels = tokenizer, cfg, answer_labels

    def collate(self, examples: list[ReaderExample]) -> dict[str, torch.Tensor]:
        enc = encode_fid_inputs(self.tokenizer, [e.question for e in examples],
                                [[(t, x) for _, t, x in e.passages[:self.cfg.n_passages]] for e in examples],
                                self.cfg.max_passage_tokens)
        labels = self.answer_labels(self.tokenizer, [e.answers[0] for e in examples],
                                    self.cfg.max_answer_tokens)  # (batch, tgt_len)
        return {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask, "labels": labels}

    def loss(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        return out.loss, {"answer_tokens": float((batch["labels"] >= 0).sum())}


@dataclass(frozen=True)
class EncodedExample:
    """A reader example whose passages went through the frozen encoder once: ``hidden``
    ``(n_passages * seq_len, hidden)`` float16, ``mask`` ``(n_passages * seq_len,)`` long."""

    hidden: torch.Tensor
    mask: torch.Tensor
    answer: str


@torch.no_grad()
def encode_examples(model, tokenizer, examples: Sequence[ReaderExample], cfg: ReaderTrainConfig,
                    batch_size: int = 8) -> list[EncodedExample]:
    """Run the (frozen) encoder once over every example's ``n_passages`` passages (FiD fusion)."""
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        enc = encode_fid_inputs(tokenizer, [e.question for e in chunk],
                                [[(t, x) for _, t, x in e.passages[:cfg.n_passages]] for e in chunk],
                                cfg.max_passage_tokens)
        hidden, mask = model.encode(enc.input_ids, enc.attention_mask)  # (batch, n_passages * seq_len, hidden)
        out += [EncodedExample(h.half().clone(), m.clone(), e.answers[0]) for h, m, e in zip(hidden, mask, chunk)]
    model.train(was_training)
    return out


class EncodedReaderHooks:
    """Training hooks over :class:`EncodedExample` (frozen encoder): collate pads the fused
    encodings to the longest of the batch (mask 0), loss = the decoder's LM loss."""

    def __init__(self, tokenizer, cfg: ReaderTrainConfig, answer_labels: Callable):
        self.tokenizer, self.cfg, self.answer_labels = tokenizer, cfg, answer_labels

    def collate(self, examples: list[EncodedExample]) -> dict[str, torch.Tensor]:
        length = max(e.mask.shape[0] for e in examples)
        hidden = torch.zeros(len(examples), length, examples[0].hidden.shape[-1])  # (batch, length, hidden)
        mask = torch.zeros(len(examples), length, dtype=torch.long)                 # (batch, length)
        for i, e in enumerate(examples):
            hidden[i, : e.mask.shape[0]] = e.hidden.float()
            mask[i, : e.mask.shape[0]] = e.mask
        labels = self.answer_labels(self.tokenizer, [e.answer for e in examples], self.cfg.max_answer_tokens)
        return {"encoder_hidden_states": hidden, "encoder_attention_mask": mask, "labels": labels}

    def loss(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        out = model(None, None, labels=batch["labels"], encoder_hidden_states=batch["encoder_hidden_states"],
                    encoder_attention_mask=batch["encoder_attention_mask"])
        return out.loss, {"answer_tokens": float((batch["labels"] >= 0).sum())}


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
    model, tokenizer = build_reader(cfg.fid)
    if getattr(cfg.fid, "freeze_encoder", False):  # encoder outputs never change: compute them once
        data, hooks = encode_examples(model, tokenizer, kept, cfg), EncodedReaderHooks(tokenizer, cfg, model.answer_labels)
    else:
        data, hooks = kept, ReaderHooks(tokenizer, cfg, model.answer_labels)
    result = train(model, data, hooks, cfg.train, log_metrics=log_metrics, resume=resume)
    model_dir = None
    from accelerate import PartialState  # noqa: PLC0415  (heavy: accelerate, only when a reader is trained)

    state = PartialState()
    if state.is_main_process:
        if result.full_state_dict is not None:  # ZeRO-3: the module's own parameters are partitioned
            model = load_full_state_dict(build_reader(cfg.fid)[0], result.full_state_dict)
        model_dir = save_reader(model, tokenizer, cfg, Path(cfg.train.output_dir) / READER_DIR)
    state.wait_for_everyone()
    return ReaderTrainResult(model_dir=model_dir, train=result, report=report)


def save_reader(model, tokenizer, cfg: ReaderTrainConfig, out_dir: Path) -> Path:
    """Write weights (safetensors), model config, tokenizer and ``reader_config.json`` into
    ``out_dir``, which appears complete or not at all (:func:`data_contracts.base.atomic_directory`;
    an old ``out_dir`` is replaced)."""
    out_dir = Path(out_dir)
    with atomic_directory(out_dir) as tmp:
        model.save(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / READER_CONFIG).write_text(cfg.to_json())
    logger.info("saved FiD reader to %s", out_dir)
    return out_dir


def load_reader(model_dir: str | Path) -> tuple[torch.nn.Module, object, ReaderTrainConfig]:
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
    fid = replace(cfg.fid, base=str(model_dir))
    if hasattr(fid, "tokenizer"):
        fid = replace(fid, tokenizer=str(model_dir))
    cfg = replace(cfg, fid=fid)
    model, tokenizer = build_reader(cfg.fid)
    model.eval()
    return model, tokenizer, cfg


def reader_from_checkpoint(checkpoint_dir: str | Path, cfg: ReaderTrainConfig, out_dir: Path) -> Path:
    """A saved reader (:func:`save_reader` layout) with the weights of a training checkpoint of
    :func:`train_reader` (``<output_dir>/checkpoints/step_N``), e.g. to measure a learning curve.

    Parameters
    ----------
    checkpoint_dir : a complete checkpoint directory (``model.safetensors`` of the FiD module).
    cfg : the run's ReaderTrainConfig (builds the module the weights belong to).
    out_dir : where the reader is written (atomically).

    Raises
    ------
    FileNotFoundError
        The checkpoint has no ``model.safetensors``.
    RuntimeError
        The weights do not fit the module (a key missing other than a tied one, or unexpected).
    """
    model, tokenizer = build_reader(cfg.fid)
    return save_reader(load_checkpoint_weights(model, checkpoint_dir), tokenizer, cfg, Path(out_dir))
