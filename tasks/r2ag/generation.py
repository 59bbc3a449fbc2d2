"""R²AG with a generator: building it, joint training (Eq. 9) hooks, and answer generation.

Offline there are no pretrained decoder weights, so the default generator is a small Llama
configuration initialised from scratch with a real tokenizer (the T5 SentencePiece vocabulary
or the MiniLM WordPiece one) plus the ``<R>`` special token. Where a hub or a local checkpoint
is reachable, ``R2AGGeneratorConfig.name_or_path`` loads a pretrained causal LM instead.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from funnelrag.training import TrainConfig
from funnelrag.training import train as run_training
from models.r2ag_generator import ProjectionConfig, R2AGModel, RetrievalProjection
from tasks.qa.questions import exact_match, has_answer
from tasks.r2ag.features import FEATURE_NAMES, feature_columns
from tasks.r2ag.prompting import IGNORE_INDEX, PromptConfig, PromptTooLong, add_r_token, encode_prompt
from tasks.r2ag.qdm import ListExample, collate_lists

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class R2AGGeneratorConfig:
    """The decoder-only generator.

    name_or_path : pretrained causal LM (hub name or directory); ``None`` = build from scratch.
    tokenizer : tokenizer directory or hub name; the aliases ``"t5"`` (the data mirror's T5
        tokenizer) and ``"minilm"`` are resolved to directories at the flow boundary. Used when
        building from scratch, and for a pretrained model when given.
    hidden_size, n_layers, n_heads, intermediate_size : the from-scratch Llama shape.
    seed : initialisation seed of the from-scratch model.
    freeze : keep the generator frozen during joint training (the paper's low-resource setting).
    """

    name_or_path: str | None = None
    tokenizer: str | None = "t5"
    hidden_size: int = 128
    n_layers: int = 2
    n_heads: int = 4
    intermediate_size: int = 344
    seed: int = 0
    freeze: bool = True


def build_generator(cfg: R2AGGeneratorConfig, max_positions: int):
    """``(generator, tokenizer, r_token_id)`` with ``<R>`` added to the tokenizer and vocabulary.

    Raises
    ------
    ValueError
        Neither a model nor a tokenizer is named.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: PLC0415  (heavy: transformers, only when weights are loaded)

    tok_src = cfg.tokenizer or cfg.name_or_path
    if tok_src is None:
        raise ValueError("R2AGGeneratorConfig needs a tokenizer (directory or hub name) or a pretrained model")
    tokenizer = AutoTokenizer.from_pretrained(tok_src)
    r_id = add_r_token(tokenizer)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if cfg.name_or_path is not None:
        model = AutoModelForCausalLM.from_pretrained(cfg.name_or_path)
        model.resize_token_embeddings(len(tokenizer))
    else:
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
        lcfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=cfg.hidden_size,
                           intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.n_layers,
                           num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
                           max_position_embeddings=max_positions, tie_word_embeddings=True,
                           pad_token_id=tokenizer.pad_token_id, eos_token_id=eos,
                           bos_token_id=tokenizer.bos_token_id)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            model = LlamaForCausalLM(lcfg)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer, r_id


@dataclass(frozen=True)
class JointConfig:
    """Joint training of R²-Former, projection (and optionally the generator) with Eq. 9.

    enabled : run this stage after QDM training (starts from the trained full R²-Former).
    max_steps, batch_size, lr : optimizer settings (shared loop).
    use_qdm_loss : keep L_QDM in the loss (False = the "w/o L_QDM" ablation).
    max_lists : train on at most this many training lists (CPU budget); None = all.
    generator : the decoder (from scratch offline, by name where a hub is reachable); its
        tokenizer must be a resolved directory or hub name when :func:`train_joint` runs.
    prompt : template and max_length (tokens).
    """

    enabled: bool = False
    max_steps: int = 100
    batch_size: int = 4
    lr: float = 2e-4
    use_qdm_loss: bool = True
    max_lists: int | None = 256
    generator: R2AGGeneratorConfig = field(default_factory=R2AGGeneratorConfig)
    prompt: PromptConfig = field(default_factory=lambda: PromptConfig(max_length=1024))


def train_joint(retrieval, train: Sequence[ListExample], texts: dict, cfg: JointConfig, output_dir,
                log_metrics=None):
    """Eq. 9 (``L_QDM + L_LM``): train the R²-Former, the projection (Eq. 3) and, unless frozen, the
    generator on prompts with ``<R>`` placeholders, through the shared accelerate loop.

    Parameters
    ----------
    retrieval : :class:`models.r2former.R2FormerQDM`, usually QDM-trained first.
    train : training lists (the first ``cfg.max_lists`` are used).
    texts : ``query_id -> (question, answers, [(title, text)] in rank order)``.
    cfg : JointConfig
    output_dir : run directory of the training loop.
    log_metrics : ``(metrics, step) -> None``.

    Returns
    -------
    (R2AGModel in eval mode on CPU, tokenizer, report dict with prompt counts and losses)
    """
    gcfg = cfg.generator
    if gcfg.name_or_path is None and gcfg.freeze:
        log.warning("joint training against a frozen generator initialised from scratch: L_LM cannot fall "
                    "(no pretrained weights offline); set generator.name_or_path or generator.freeze=false")
    generator, tokenizer, r_id = build_generator(gcfg, max_positions=cfg.prompt.max_length + 64)
    h2 = generator.get_input_embeddings().embedding_dim
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(gcfg.seed)
        projection = RetrievalProjection(ProjectionConfig(in_size=retrieval.cfg.hidden_size, out_size=h2))
    model = R2AGModel(retrieval, projection, generator, r_id, freeze_generator=gcfg.freeze,
                      use_qdm_loss=cfg.use_qdm_loss)
    items, report = prompted_lists(list(train)[:cfg.max_lists], texts, tokenizer, r_id, cfg.prompt, with_answer=True)
    if not items:
        raise ValueError("no training prompt fits prompt.max_length")
    tcfg = TrainConfig(output_dir=str(output_dir), seed=gcfg.seed, max_steps=cfg.max_steps,
                       batch_size=cfg.batch_size, lr=cfg.lr, scheduler="constant", log_every=10,
                       checkpoint_every=0, cpu=not torch.cuda.is_available())
    result = run_training(model, items, JointHooks(tokenizer.pad_token_id), tcfg, log_metrics=log_metrics,
                          resume=False)
    report.update(steps=result.global_step, first_loss=result.losses[0], last_loss=result.losses[-1])
    return model.cpu().eval(), tokenizer, report


@dataclass(frozen=True)
class PromptedList:
    """A ranked list with its tokenized prompt: what joint training and generation consume."""

    example: ListExample
    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    answers: tuple[str, ...]
    truncated_tokens: int


def prompted_lists(examples: Sequence[ListExample], texts: dict[str, tuple[str, list[str], list[tuple[str, str]]]],
                   tokenizer, r_token_id: int, cfg: PromptConfig, with_answer: bool) -> tuple[list[PromptedList], dict]:
    """Tokenize the prompt of every list (answer appended when ``with_answer``, for Eq. 9's L_LM).

    Parameters
    ----------
    examples : lists with features, in any order.
    texts : ``query_id -> (question, answers, [(title, text), ...] in rank order)``.

    Returns
    -------
    (prompted lists, report) — lists whose fixed prompt parts exceed ``max_length`` are skipped
    and counted under ``skipped_prompt_too_long`` (the error names each query in the log).
    """
    out: list[PromptedList] = []
    skipped = truncated_lists = truncated_tokens = 0
    for e in examples:
        question, answers, docs = texts[e.query_id]
        if len(docs) != len(e.labels):
            raise ValueError(f"query {e.query_id}: {len(docs)} document texts for {len(e.labels)} feature rows")
        try:
            enc = encode_prompt(question, docs, tokenizer, r_token_id, cfg,
                                answer=answers[0] if with_answer else None, query_id=e.query_id)
        except PromptTooLong as exc:
            log.warning("%s", exc)
            skipped += 1
            continue
        truncated_lists += int(enc.truncated_tokens > 0)
        truncated_tokens += enc.truncated_tokens
        out.append(PromptedList(e, enc.input_ids, enc.labels, tuple(answers), enc.truncated_tokens))
    return out, {"prompts": len(out), "skipped_prompt_too_long": skipped,
                 "truncated_prompts": truncated_lists, "truncated_document_tokens": truncated_tokens}


def collate_prompted(items: Sequence[PromptedList], pad_id: int, features: Sequence[str] = FEATURE_NAMES,
                     left_pad: bool = False) -> dict[str, torch.Tensor]:
    """Batch of lists + prompts: the :func:`collate_lists` tensors plus ``input_ids``,
    ``attention_mask`` and ``lm_labels`` ``(batch, seq_len)`` (right padding for training, left for
    generation)."""
    batch = collate_lists([it.example for it in items], feature_columns(features))
    seq_len = max(len(it.input_ids) for it in items)
    ids = torch.full((len(items), seq_len), pad_id, dtype=torch.long)
    att = torch.zeros(len(items), seq_len, dtype=torch.long)
    lab = torch.full((len(items), seq_len), IGNORE_INDEX, dtype=torch.long)
    for b, it in enumerate(items):
        n = len(it.input_ids)
        sl = slice(seq_len - n, seq_len) if left_pad else slice(0, n)
        ids[b, sl] = torch.tensor(it.input_ids)
        att[b, sl] = 1
        lab[b, sl] = torch.tensor(it.labels)
    batch.update(input_ids=ids, attention_mask=att, lm_labels=lab)
    return batch


@dataclass(frozen=True)
class JointHooks:
    """:class:`funnelrag.training.TrainHooks` of Eq. 9 (``L_QDM + L_LM``)."""

    pad_id: int
    features: tuple[str, ...] = FEATURE_NAMES

    def collate(self, examples: list) -> dict[str, torch.Tensor]:
        return collate_prompted(examples, self.pad_id, self.features)

    def loss(self, model, batch) -> tuple[torch.Tensor, dict[str, float]]:
        out = model(batch["features"], batch["doc_mask"], batch["input_ids"], batch["attention_mask"],
                    labels=batch["lm_labels"], doc_labels=batch["labels"])
        extras = {"lm_loss": out.lm_loss.item()}
        if out.qdm_loss is not None:
            extras["qdm_loss"] = out.qdm_loss.item()
        return out.loss, extras


@torch.no_grad()
def generate_answers(model, items: Sequence[PromptedList], tokenizer, features: Sequence[str] = FEATURE_NAMES,
                     batch_size: int = 8, max_new_tokens: int = 16) -> list[str]:
    """Greedy answers of :class:`models.r2ag_generator.R2AGModel` for prompts built without answers."""
    model.eval()
    device = next(model.parameters()).device
    out: list[str] = []
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        b = collate_prompted(chunk, tokenizer.pad_token_id, features, left_pad=True)
        gen = model.generate(b["features"].to(device), b["doc_mask"].to(device), b["input_ids"].to(device),
                             b["attention_mask"].to(device), max_new_tokens=max_new_tokens)  # (batch, n_new)
        out.extend(tokenizer.batch_decode(gen, skip_special_tokens=True))
    return [s.strip() for s in out]


def answer_accuracy(predictions: Sequence[str], answers: Sequence[Sequence[str]]) -> dict[str, float]:
    """The paper's Acc (a gold answer occurs in the output, DPR ``has_answer``) and SQuAD EM."""
    if not predictions:
        return {"accuracy": float("nan"), "exact_match": float("nan"), "n": 0}
    acc = np.mean([has_answer(list(a), p) for p, a in zip(predictions, answers)])
    em = np.mean([exact_match(p, list(a)) for p, a in zip(predictions, answers)])
    return {"accuracy": float(acc), "exact_match": float(em), "n": len(predictions)}
