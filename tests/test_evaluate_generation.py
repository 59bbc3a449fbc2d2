"""Answer generators: the causal-LM hook on a small real transformers model saved locally, and
the FiD generator's passage cut (no LLM weights are reachable here)."""
from __future__ import annotations

import pytest
import torch

from models.encoders import resolve_model_path
from tasks.qa.generation import CausalLMGenerator, FiDGenerator, GenerationConfig, build_prompt

PASSAGES = [("Charles Darwin", "Darwin published On the Origin of Species in 1859."),
            ("Alfred Russel Wallace", "Wallace co-discovered natural selection.")]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: 1 intra-op thread on shared cores


def test_prompt_numbers_passages_and_ends_with_the_question():
    prompt = build_prompt("who wrote on the origin of species", PASSAGES)
    assert "[1] Charles Darwin: Darwin published" in prompt and "[2] Alfred Russel Wallace:" in prompt
    assert prompt.rstrip().endswith("Question: who wrote on the origin of species\nAnswer:")


@pytest.fixture(scope="module")
def causal_lm_dir(tmp_path_factory):
    """A 1-layer GPT-2 (seeded init) with the real MiniLM WordPiece tokenizer, saved like any
    local LLM directory."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel  # noqa: PLC0415

    d = tmp_path_factory.mktemp("tiny-llm")
    tok = AutoTokenizer.from_pretrained(resolve_model_path("minilm"))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=512, n_embd=32, n_layer=1, n_head=2,
                                       bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id))
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_causal_lm_hook_generates_from_a_local_directory(causal_lm_dir):
    gen = CausalLMGenerator("llm:tiny", str(causal_lm_dir), GenerationConfig(max_answer_tokens=4, max_prompt_tokens=64))
    first = gen("who wrote on the origin of species", PASSAGES)
    assert isinstance(first, str) and "\n" not in first
    assert gen("who wrote on the origin of species", PASSAGES) == first        # greedy: deterministic
    long = [("T", "word " * 400)] * 3
    assert isinstance(gen("q?", long), str)                                    # prompt truncated from the left


def test_causal_lm_hook_fails_clearly_without_weights(tmp_path):
    with pytest.raises(OSError):
        CausalLMGenerator("llm:none", str(tmp_path / "missing"))


def test_fid_generator_without_passages_answers_empty():
    gen = FiDGenerator("fid", model=None, tokenizer=None)
    assert gen("q", []) == ""


def test_fid_answers_in_batches_equal_answers_one_by_one(data_mirror):
    """Batched greedy FiD answers (padding to the batch's longest input, mixed passage counts,
    batches smaller than the questions) are each question's answer alone."""
    from models.fid import FiDConfig, FiDReader  # noqa: PLC0415

    model, tok = FiDReader.from_config(FiDConfig(tokenizer=str(data_mirror / "t5-tokenizer"), d_model=32, n_layers=2,
                                                 n_heads=2, d_ff=64, seed=3))
    model.eval()
    gen = FiDGenerator("fid", model, tok, GenerationConfig(n_passages=2, max_passage_tokens=48, max_answer_tokens=6,
                                                           batch_size=3))
    questions = [f"question {i}: who wrote {'the book ' * i}on species" for i in range(7)]
    passages = [PASSAGES, PASSAGES[:1], [], PASSAGES[::-1], [("Short", "x")], PASSAGES * 2, [("Long", "word " * 90)]]
    alone = [gen(q, ps) for q, ps in zip(questions, passages)]
    assert gen.answers(questions, passages) == alone and alone[2] == ""
    assert any(alone) and all(isinstance(a, str) for a in alone)
    with pytest.raises(ValueError, match="passage lists"):
        gen.answers(questions, passages[:2])
