"""Answer generation on retrieved passages for EM (FunnelRAG Table 3's shape).

Two generators behind one call ``generator(question, passages) -> answer``:

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


@dataclass(frozen=True)
class GenerationConfig:
    """Generation settings.

    n_passages : top passages given to the generator (FunnelRAG: the top 4).
    max_passage_tokens : FiD tokens per ``question: q title: t context: p`` input.
    max_answer_tokens : new tokens generated.
    max_prompt_tokens : causal-LM prompt length limit (tokens, truncated from the left).
    """

    n_passages: int = 4
    max_passage_tokens: int = 200
    max_answer_tokens: int = 20
    max_prompt_tokens: int = 1024


class FiDGenerator:
    """Greedy FiD answers (Izacard & Grave 2021) from a loaded reader and its T5 tokenizer."""

    def __init__(self, label: str, model, tokenizer, cfg: GenerationConfig = GenerationConfig()):
        self.label, self.model, self.tokenizer, self.cfg = label, model, tokenizer, cfg

    @torch.no_grad()
    def __call__(self, question: str, passages: Sequence[Passage]) -> str:
        """The decoded answer (special tokens skipped); ``""`` when there is no passage."""
        passages = list(passages)[: self.cfg.n_passages]
        if not passages:
            return ""
        enc = encode_fid_inputs(self.tokenizer, [question], [passages], self.cfg.max_passage_tokens)
        device = next(self.model.parameters()).device
        ids = self.model.generate(enc.input_ids.to(device), enc.attention_mask.to(device),
                                  max_answer_tokens=self.cfg.max_answer_tokens)   # (1, <= max_answer_tokens + 1)
        return self.tokenizer.decode(ids[0], skip_special_tokens=True).strip()


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
