"""Evaluation of flat vs progressive retrieval (FunnelRAG Tables 2, 3, 9, 11–13).

Modules: :mod:`~tasks.evaluate.metrics` (AR@k, EM, title entropy, answerability),
:mod:`~tasks.evaluate.timing` (per-stage seconds), :mod:`~tasks.evaluate.retrieval` (flat and
progressive settings), :mod:`~tasks.evaluate.generation` (FiD / causal-LM answers),
:mod:`~tasks.evaluate.models` (model references), :mod:`~tasks.evaluate.stages` (questions,
dense index cache, retrievers), :mod:`~tasks.evaluate.report` (tables, markdown, plot).
"""
