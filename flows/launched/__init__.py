"""Training entry points run on every rank by ``accelerate launch … -m flows.launched.<model> --spec <json>``.

Each module reads a spec written by :func:`funnelrag.launch.launch` (inputs: stage-cache
directories; configs; run and output directories; tracking), trains with
:func:`funnelrag.training.train` on every rank and, on the main rank, writes the model into the
spec's ``out_dir`` exactly as the in-process stage does, and the result JSON. They are wiring,
like the flows beside them, and import no Prefect (a rank is not a flow run; the GPU check runs
them where Prefect and MLflow are not installed): ``tests/test_training_launch.py`` checks it.

* :mod:`flows.launched.reader` — the FiD reader (T5 or MiniLM BERT2BERT), stage ``reader``.
* :mod:`flows.launched.preranker` — BPR distillation of the pre-ranker (Eq. 6), stage ``distill``.
"""
