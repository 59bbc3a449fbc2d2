"""Data-parallel passage embedding on every rank:
``accelerate launch … -m flows.launched.embed --spec <json>``.

Rank ``r`` of ``W`` embeds the ``r``-th of ``W`` contiguous parts of the passages the vector
store does not hold yet (:func:`tasks.funnel.embeddings.embed_passages` with ``rank``/``world``)
on its own device (``cuda:<LOCAL_RANK>`` where GPUs are visible and the launch is not on CPU)
and writes its vectors to the store as they arrive; no collective runs. The flow then builds
the index from the store (the join: every vector found, nothing embedded).

Spec keys (written by :func:`embed_with_workers`): ``preranker_dir`` (a saved pre-ranker,
:func:`models.preranker.save_preranker`), ``texts_path`` (an Arrow IPC file, one ``text``
column: the distinct passage texts, as embedded, that the store lacked when the launch was
prepared, corpus order of first use), ``store_root``, ``embedding`` (the
:class:`tasks.funnel.embeddings.EmbeddingConfig` as JSON), ``cpu``.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from funnelrag import launch as L
from funnelrag.content_store import distinct_keys, text_keys

MODULE = "flows.launched.embed"
TEXTS_FILE = "texts.arrow"


def run(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Embed this rank's part into the store; the main rank writes the result JSON."""
    import torch  # noqa: PLC0415  (heavy: torch, only on a rank: after die_with_parent, inside rank_guard)

    from models.preranker import load_preranker  # noqa: PLC0415  (heavy: torch, only on a rank)
    from tasks.funnel.embeddings import EmbeddingConfig, embed_passages  # noqa: PLC0415  (heavy: torch, only on a rank)
    from tasks.funnel.vector_store import VectorStore  # noqa: PLC0415  (heavy: numpy store, only on a rank)

    t0 = time.perf_counter()
    rank, world = L.rank(), int(os.environ.get("WORLD_SIZE", "1"))
    model, tok = load_preranker(Path(spec["preranker_dir"]))
    if not spec.get("cpu") and torch.cuda.is_available():
        model.to(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    with pa.memory_map(spec["texts_path"]) as source:
        texts = pa.ipc.open_file(source).read_all()["text"].to_pylist()
    store = VectorStore(Path(spec["store_root"]), model.encoder.backbone.config.hidden_size)
    _, info = embed_passages(texts, model, tok, EmbeddingConfig(**spec["embedding"]), store, rank=rank, world=world)
    if not L.is_main_process():
        return None
    res = {**info, "world_size": world, "seconds": time.perf_counter() - t0, "peak_gpu_mem_gib": L.peak_gpu_memory_gib()}
    L.write_result(spec, res)
    return res


def embed_with_workers(texts: Sequence[str], model, tokenizer, store, cfg, work_dir: Path,
                       launch_cfg: L.LaunchConfig, *, keys: np.ndarray | None = None, logger=None) -> dict[str, Any]:
    """Flow side: embed the passages ``store`` (:class:`tasks.funnel.vector_store.VectorStore`)
    lacks on the ranks of one ``accelerate launch`` (the pre-ranker saved and only the missing
    texts written under ``work_dir`` first, so a night's ranks read and hash its new texts, not
    the corpus), then re-read the store. ``keys``: ``(len(texts), 2)`` uint64, the texts' keys
    when the caller holds them (:func:`tasks.funnel.embeddings.corpus_text_keys`); hashed here
    otherwise. Returns the main rank's figures plus ``embedded_total`` (distinct texts the
    workers embedded together). The caller then builds the index from the store (the join).

    Raises
    ------
    funnelrag.launch.LaunchFailed
        A rank failed (its traceback in the message).
    """
    from models.preranker import save_preranker  # noqa: PLC0415  (heavy: torch, only when a launch is prepared)

    keys = text_keys(texts) if keys is None else keys                              # (n, 2)
    ukeys, first, _ = distinct_keys(keys)
    todo = np.sort(first[~store.lookup(ukeys).found])                              # corpus order of first use
    missing = int(todo.size)
    if not missing:
        return {"embedded_total": 0, "world_size": 0}
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    save_preranker(model, tokenizer, work_dir / "preranker")
    table = pa.table({"text": pa.array([texts[int(i)] for i in todo], pa.large_string())})
    with pa.OSFile(str(work_dir / TEXTS_FILE), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    cpu = L.resolve_processes(launch_cfg)[1]
    spec = {"preranker_dir": str(work_dir / "preranker"), "texts_path": str(work_dir / TEXTS_FILE),
            "store_root": str(store.root), "embedding": asdict(cfg), "cpu": cpu}
    result = L.launch(MODULE, spec, work_dir / "launch", launch_cfg, logger=logger)
    store.refresh()                                    # the workers' segments, verified
    return {**result, "embedded_total": missing}


if __name__ == "__main__":
    L.entry_main(run)
