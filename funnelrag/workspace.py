"""Every path of a run comes from one object (ColBERT ``Run``, nanoGPT's out_dir)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Workspace:
    """Derives all artifact locations from ``home``.

    Layout::

        home/
          stores/corpus/<name>/versions/<version_id>/   published corpus versions (tasks.corpus.published)
          stores/corpus/<name>/current                  text file naming the current version
          cache/<pipeline>/<stage>/<key>/...            content-keyed stage outputs (funnelrag.stages);
                                                        pipeline: corpus, distillation, evaluate, dr_rag, r2ag
          runs/<flow>/<run_id or key>/...               scratch of one flow run (checkpoints, tables)
          mlflow.db, mlruns/                        MLflow tracking (SQLite + artifacts)
          downloads/                                data fetched from canonical URLs
    """

    home: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "home", Path(self.home).resolve())

    def store_dir(self, name: str) -> Path:
        return self.home / "stores" / name

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"

    def run_dir(self, flow: str, run_id: str) -> Path:
        return self.home / "runs" / flow / run_id

    @property
    def downloads_dir(self) -> Path:
        return self.home / "downloads"

    @property
    def mlflow_db(self) -> Path:
        return self.home / "mlflow.db"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.home / "mlruns"

    def tracking_uri(self, override: str | None = None) -> str:
        return override or f"sqlite:///{self.mlflow_db}"
