"""Answer generation on retrieved passages for EM (FunnelRAG Table 3's shape).

Two generators behind one call ``generator(question, passages) -> answer``, and its batched form
``generator.answers(questions, passages_per_question) -> answers`` (FiD: one ``generate`` a batch):

* :class:`FiDGenerator` — the FiD reader (:class:`models.fid.FiDReader`), greedy decoding over
  the fused passages, as in FunnelRAG's FiD rows.
* :class:`CausalLMGenerator` — the hook for an LLM generator (Table 3's LLM rows): any local
  ``AutoModelForCausalLM`` directory (or a hub name where a hub is reachable), prompted with the
  passages and the question, greedy decoding, the first line of the continuation as the answer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from models.fid import encode_fid_inputs

Passage = tuple[str, str]  # (title, text)

PROMPT = ("Answer the question with a short phrase, using the passages.\n\n{passages}\n\n"
          "Question: {question}\nAnswer:")


class Generator(Protocol):
    """``generator(question, passages) -> answer`` (passages best first)."""

    label: str

    def __call__(self, question: str, passages: Sequence[Passage]) -> str: ...

    def answers(self, questions: Sequence[str], passages: Sequence[Sequence[Passage]]) -> list[str]: ...


@dataclass(frozen=True)
class GenerationConfig:
    """Generation settings.

    n_passages : top passages given to the generator (FunnelRAG: the top 4).
    max_passage_tokens : FiD tokens per ``question: q title: t context: p`` input.
    max_answer_tokens : new tokens generated.
    max_prompt_tokens : causal-LM prompt length limit (tokens, truncated from the left).
    batch_size : questions per FiD ``generate`` call (:meth:`FiDGenerator.answers`).
    """

    n_passages: int = 4
    max_passage_tokens: int = 200
    max_answer_tokens: int = 20
    max_prompt_tokens: int = 1024
    batch_size: int = 16


class FiDGenerator:
    """Greedy FiD answers (Izacard & Grave 2021) from a loaded reader and its T5 tokenizer."""

    def __init__(self, label: str, model, tokenizer, cfg: GenerationConfig = GenerationConfig()):
        self.label, self.model, self.tokenizer, self.cfg = label, model, tokenizer, cfg

    def __call__(self, question: str, passages: Sequence[Passage]) -> str:
        """The decoded answer (special tokens skipped); ``""`` when there is no passage."""
        return self.answers([question], [passages])[0]

    @torch.no_grad()
    def answers(self, questions: Sequence[str], passages: Sequence[Sequence[Passage]]) -> list[str]:
        """Greedy answers of many questions, ``cfg.batch_size`` questions a ``generate`` call.

        Questions are batched with others that have as many passages (at most ``n_passages``
        each), so no passage is padding; inside a batch the shorter encoder inputs are padded
        and masked, and a finished answer is padded by ``generate``, so each answer is the one
        the question gets alone (up to float rounding; ``tests/test_evaluate_generation.py``).

        Parameters
        ----------
        questions : ``n`` questions.
        passages : per question, its ``(title, text)`` passages, best first.

        Returns
        -------
        list[str]
            ``n`` decoded answers (special tokens skipped); ``""`` for a question without passages.

        Raises
        ------
        ValueError
            ``questions`` and ``passages`` differ in length.
        """
        if len(questions) != len(passages):
            raise ValueError(f"{len(questions)} questions but {len(passages)} passage lists")
        kept = [list(p)[: self.cfg.n_passages] for p in passages]
        out = [""] * len(questions)
        by_count: dict[int, list[int]] = {}
        for i, ps in enumerate(kept):
            if ps:
                by_count.setdefault(len(ps), []).append(i)
        device = next(self.model.parameters()).device if by_count else None
        for rows in by_count.values():
            for a in range(0, len(rows), self.cfg.batch_size):
                part = rows[a:a + self.cfg.batch_size]
                enc = encode_fid_inputs(self.tokenizer, [questions[i] for i in part], [kept[i] for i in part],
                                        self.cfg.max_passage_tokens)            # (batch, n_passages, seq_len)
                ids = self.model.generate(enc.input_ids.to(device), enc.attention_mask.to(device),
                                          max_answer_tokens=self.cfg.max_answer_tokens)   # (batch, <= max_answer_tokens + 1)
                for i, text in zip(part, self.tokenizer.batch_decode(ids, skip_special_tokens=True)):
                    out[i] = text.strip()
        return out


def build_prompt(question: str, passages: Sequence[Passage]) -> str:
    """The causal-LM prompt: numbered ``[i] title: text`` passages, then the question."""
    block = "\n".join(f"[{i}] {title}: {text}" for i, (title, text) in enumerate(passages, 1))
    return PROMPT.format(passages=block, question=question)


class CausalLMGenerator:
    """An LLM generator hook: ``AutoModelForCausalLM`` + tokenizer from ``name_or_path``.

    Raises
    ------
    OSError
        From ``from_pretrained`` when the weights are not reachable (no local directory, no hub).
    """

    def __init__(self, label: str, name_or_path: str, cfg: GenerationConfig = GenerationConfig()):
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415  (heavy: transformers, only when weights are loaded)

        self.label, self.cfg = label, cfg
        self.tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        self.tokenizer.truncation_side = "left"   # keep the question at the end of the prompt
        self.model = AutoModelForCausalLM.from_pretrained(name_or_path)
        self.model.eval()

    @torch.no_grad()
    def __call__(self, question: str, passages: Sequence[Passage]) -> str:
        """First line of the greedy continuation of :func:`build_prompt`."""
        prompt = build_prompt(question, list(passages)[: self.cfg.n_passages])
        enc = self.tokenizer(prompt, return_tensors="pt", truncation=True, max_length=self.cfg.max_prompt_tokens)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        out = self.model.generate(**enc, max_new_tokens=self.cfg.max_answer_tokens, do_sample=False,
                                  num_beams=1, pad_token_id=pad)             # (1, prompt_len + new)
        text = self.tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        return text.strip().split("\n")[0].strip()

    def answers(self, questions: Sequence[str], passages: Sequence[Sequence[Passage]]) -> list[str]:
        """:meth:`__call__` of each question in turn (one prompt a call)."""
        if len(questions) != len(passages):
            raise ValueError(f"{len(questions)} questions but {len(passages)} passage lists")
        return [self(q, ps) for q, ps in zip(questions, passages)]
