"""Retrieval-aware prompting: one <R> per document, placeholder alignment (Eq. 5), truncation,
and the R²AG model's joint loss (Eq. 9) with a frozen generator on the real T5 tokenizer."""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from funnelrag.datasets import resolve
from models.r2ag_generator import ProjectionConfig, R2AGModel, RetrievalProjection, assemble_inputs_embeds
from models.r2former import R2FormerConfig, R2FormerQDM
from tasks.r2ag.generation import (R2AGGeneratorConfig, JointHooks, PromptedList, build_generator, collate_prompted,
                                   generate_answers)
from tasks.r2ag.prompting import IGNORE_INDEX, PromptConfig, PromptTooLong, encode_prompt, fit_lengths
from tasks.r2ag.qdm import ListExample


@pytest.fixture(scope="module")
def generator(data_mirror):
    tok_dir = resolve("t5-tokenizer", data_mirror).parent
    return build_generator(R2AGGeneratorConfig(tokenizer=str(tok_dir), hidden_size=64, n_layers=1, n_heads=2,
                                           intermediate_size=128), max_positions=512)


DOCS = [("Shirley Temple", "Shirley Temple Black was an American actress and diplomat. " * 6),
        ("Kiss and Tell", "Kiss and Tell is a 1945 American comedy film."),
        ("Janet Waldo", "Janet Marie Waldo was an American radio <R> and voice actress. " * 3)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: 1 intra-op thread on shared cores


def test_one_placeholder_per_document_even_with_literal_r_in_text(generator):
    _, tok, r_id = generator
    enc = encode_prompt("Who portrayed Corliss Archer?", DOCS, tok, r_id, PromptConfig(max_length=1024))
    assert len(enc.r_positions) == 3 and enc.input_ids.count(r_id) == 3
    assert all(enc.input_ids[p] == r_id for p in enc.r_positions)
    assert enc.truncated_tokens == 0 and all(lab == IGNORE_INDEX for lab in enc.labels)
    # each placeholder sits right before its document's text (Eq. 5)
    first_doc = tok.decode(enc.input_ids[enc.r_positions[1] + 1:enc.r_positions[1] + 6])
    assert first_doc.startswith("Kiss and Tell")


def test_truncation_keeps_every_placeholder_and_the_answer(generator):
    _, tok, r_id = generator
    full = encode_prompt("Who?", DOCS, tok, r_id, PromptConfig(max_length=1024), answer="Shirley Temple")
    limit = len(full.input_ids) - 40
    enc = encode_prompt("Who?", DOCS, tok, r_id, PromptConfig(max_length=limit), answer="Shirley Temple")
    assert len(enc.input_ids) <= limit and enc.truncated_tokens >= 40
    assert enc.input_ids.count(r_id) == 3
    assert enc.doc_tokens[1] == full.doc_tokens[1]  # the short document stays whole (longest first)
    answer = [t for t, lab in zip(enc.input_ids, enc.labels) if lab != IGNORE_INDEX]
    assert tok.decode(answer, skip_special_tokens=True).strip() == "Shirley Temple"
    assert answer[-1] == tok.eos_token_id


def test_prompt_too_long_is_a_clear_error(generator):
    _, tok, r_id = generator
    with pytest.raises(PromptTooLong, match="query q7.*3 <R> placeholders"):
        encode_prompt("Who?", DOCS, tok, r_id, PromptConfig(max_length=20), query_id="q7")
    with pytest.raises(ValueError, match="at least one document"):
        encode_prompt("Who?", [], tok, r_id)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=10), st.integers(0, 300))
@example([3, 3], 5)  # the spare token completes the first document: kept [3, 2]
@example([5, 1, 9, 9], 10)
def test_fit_lengths_respects_budget_and_is_longest_first(lengths, budget):
    kept = fit_lengths(lengths, budget)
    assert sum(kept) == min(sum(lengths), budget)
    assert all(0 <= k <= n for k, n in zip(kept, lengths))
    cut = [k for k, n in zip(kept, lengths) if k < n]
    if cut:  # truncated documents are cut to within one token of each other; no document keeps more
        # than one token beyond the shortest cut (only the cap c or c + 1 survive a cut)
        assert max(cut) - min(cut) <= 1 and all(k <= min(cut) + 1 for k in kept)
        # the spare tokens (c + 1) go to the earliest-ranked documents that were longer than c
        c = min(cut)
        longer = [i for i, n in enumerate(lengths) if n > c]
        bonus = [i for i in longer if kept[i] == c + 1]
        assert bonus == longer[:len(bonus)]


def test_assemble_places_each_retrieval_embedding_at_its_placeholder():
    r_id = 7
    ids = torch.tensor([[1, 7, 2, 2, 7, 3, 7, 0],
                        [1, 7, 5, 7, 0, 0, 0, 0]])  # 3 docs, then 2 docs + padding
    tok = torch.randn(2, 8, 4)
    e_r = torch.randn(2, 3, 4)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    out = assemble_inputs_embeds(tok, ids, r_id, e_r, mask)
    for b, positions in ((0, [1, 4, 6]), (1, [1, 3])):
        for i, p in enumerate(positions):
            torch.testing.assert_close(out[b, p], e_r[b, i])
        others = [p for p in range(8) if p not in positions]
        torch.testing.assert_close(out[b, others], tok[b, others])
    with pytest.raises(ValueError, match=r"row\(s\) \[1\].*\[2\] <R> placeholders for \[3\] documents"):
        assemble_inputs_embeds(tok, ids, r_id, e_r, torch.ones(2, 3, dtype=torch.bool))


def _r2ag(generator, freeze=True):
    gen, tok, r_id = generator
    torch.manual_seed(0)
    retrieval = R2FormerQDM(R2FormerConfig(hidden_size=32, n_heads=2, n_layers=1))
    proj = RetrievalProjection(ProjectionConfig(in_size=32, out_size=gen.get_input_embeddings().embedding_dim))
    return R2AGModel(retrieval, proj, gen, r_id, freeze_generator=freeze), tok, r_id


def _items(tok, r_id, answer: bool) -> list[PromptedList]:
    items = []
    for n, qid in ((3, "a"), (2, "b")):
        enc = encode_prompt(f"question {qid}?", DOCS[:n], tok, r_id, PromptConfig(max_length=96),
                            answer="Shirley Temple" if answer else None)
        ex = ListExample(qid, torch.randn(n, 3).numpy(), (torch.arange(n) == 0).to(torch.int8).numpy())
        items.append(PromptedList(ex, enc.input_ids, enc.labels, ("Shirley Temple",), enc.truncated_tokens))
    return items


def test_joint_loss_is_qdm_plus_lm_and_trains_only_the_retrieval_side(generator):
    model, tok, r_id = _r2ag(generator)
    model.train()
    batch = collate_prompted(_items(tok, r_id, answer=True), tok.pad_token_id)
    assert batch["input_ids"].shape[0] == 2 and batch["doc_mask"].sum().item() == 5
    loss, extras = JointHooks(tok.pad_token_id).loss(model, batch)
    assert loss.item() == pytest.approx(extras["lm_loss"] + extras["qdm_loss"], rel=1e-5)
    loss.backward()
    assert all(p.grad is None for p in model.generator.parameters())  # frozen generator
    assert model.projection.mlp[0].weight.grad.abs().sum() > 0  # LM loss reaches the projection
    assert model.retrieval.r2former.input_proj.weight.grad.abs().sum() > 0


def test_generation_from_left_padded_placeholder_prompts(generator):
    model, tok, r_id = _r2ag(generator)
    preds = generate_answers(model, _items(tok, r_id, answer=False), tok, batch_size=2, max_new_tokens=3)
    assert len(preds) == 2 and all(isinstance(p, str) for p in preds)
