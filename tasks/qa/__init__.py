"""Open-domain QA shared by every pipeline: questions loading, DPR answer matching, SQuAD EM
(:mod:`~tasks.qa.questions`) and the one answer recall AR@k and EM rate (:mod:`~tasks.qa.metrics`)."""
