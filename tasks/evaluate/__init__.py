"""Evaluation of flat vs progressive retrieval (FunnelRAG Tables 2, 3, 9, 11–13).

Modules: :mod:`~tasks.evaluate.timing` (per-stage seconds), :mod:`~tasks.evaluate.retrieval`
(flat and progressive settings), :mod:`~tasks.evaluate.stored_retrieval` and
:mod:`~tasks.evaluate.flat_dense` (settings over the stored passage vectors),
:mod:`~tasks.evaluate.models` (model references), :mod:`~tasks.evaluate.stages` (questions,
answerability, the BM25 retriever, generation), :mod:`~tasks.evaluate.report` (tables,
markdown, plot). The measures (AR@k, EM, title entropy) and the answer generators are shared
with the other pipelines: :mod:`tasks.qa.metrics`, :mod:`tasks.qa.generation`.
"""
