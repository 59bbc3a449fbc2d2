"""DR-RAG (Hei et al. 2024): QDC retrieval, the classifier C(q, d1, d2), CFS and CIS selection.

Modules: :mod:`collection` (paragraph collection, gold), :mod:`retrieval` (BM25, SM, ``q ⊕ d``),
:mod:`selection` (QDC, CFS, CIS), :mod:`pairs` (Appendix A.1 training pairs), :mod:`classifier`
(training hooks, scoring, save/load), :mod:`evaluate` (Table 5).
"""
