"""Evaluation of flat vs progressive retrieval (FunnelRAG Tables 2, 3, 9, 11–13).

Modules: (AR@k, EM, title entropy and answerability: :mod:`tasks.qa.metrics`),
:mod:`~tasks.evaluate.timing` (per-stage seconds), :mod:`~tasks.evaluate.retrieval` (flat and
progressive settings), :mod:`~tasks.qa.generation` (FiD / causal-LM answers),
:mod:`~tasks.evaluate.models` (model references), :mod:`~tasks.evaluate.stages` (questions,
dense index cache, retrievers), :mod:`~tasks.evaluate.report` (tables, markdown, plot).
"""
