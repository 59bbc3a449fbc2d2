#!/usr/bin/env bash
# Fills the git-ignored folder .whl/ that the GPU check carries to a GPU machine (≤ 64 MiB):
#   .whl/wheels/  deepspeed as a pure-Python wheel (built here with DS_BUILD_OPS=0, the installed
#                 version) and the wheels of its pure dependencies and ours that the GPU image may
#                 lack (the image has torch 2.11+cu130, transformers, accelerate, safetensors,
#                 pyarrow, numba; not deepspeed, mlflow, prefect, bm25s, polars, faiss).
#                 check.sh installs only those whose distribution is missing there.
#   .whl/data/    the T5 tokenizer, 512 NQ-open oracle records, MiniLM (all-MiniLM-L6-v2) in float16.
# Usage: infra/gpu/fetch_wheels.sh          (from anywhere; needs PyPI and the data mirror)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${FUNNELRAG_CARRY:-.whl}
rm -rf "$OUT/wheels" "$OUT/data"
mkdir -p "$OUT/wheels" "$OUT/data"
ver() { python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }

# deepspeed without compiled ops (they are JIT-built on the GPU machine if ever needed; the check
# uses none): build against the torch installed here, no isolated build environment.
DS_BUILD_OPS=0 python -m pip wheel -q --no-deps --no-build-isolation -w "$OUT/wheels" "deepspeed==$(ver deepspeed)"

# deepspeed's dependencies beyond torch/numpy/packaging/psutil/tqdm/pydantic, and pydantic itself
# (funnelrag's configs) in case the image lacks it: binary wheels for CPython 3.12 on x86-64.
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$OUT/wheels" \
  "hjson==$(ver hjson)" "py-cpuinfo==$(ver py-cpuinfo)" "einops==$(ver einops)" "msgpack==$(ver msgpack)" \
  "ninja==$(ver ninja)" "pydantic==$(ver pydantic)" "pydantic-core==$(ver pydantic-core)" \
  "annotated-types==$(ver annotated-types)" "typing-inspection==$(ver typing-inspection)"

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python - "$OUT/data" <<'PY'
import gzip, shutil, sys
from pathlib import Path

from safetensors.torch import load_file, save_file

from funnelrag.datasets import default_mirror, resolve
from models.encoders import MINILM, resolve_model_path

out = Path(sys.argv[1])
mirror = default_mirror(Path.cwd())
tok = resolve("t5-tokenizer", mirror).parent
shutil.copytree(tok, out / "t5-tokenizer")
with gzip.open(resolve("nq-open-oracle", mirror), "rt", encoding="utf-8") as src, \
        open(out / "nq-open-oracle-sample.jsonl", "w", encoding="utf-8") as dst:
    for i, line in zip(range(512), src):
        dst.write(line)
minilm = Path(resolve_model_path(MINILM))
half = out / "minilm-fp16"
shutil.copytree(minilm, half, ignore=shutil.ignore_patterns("model.safetensors", "README.md", ".gitattributes"))
save_file({k: v.half().contiguous() for k, v in load_file(str(minilm / "model.safetensors")).items()},
          str(half / "model.safetensors"), metadata={"format": "pt"})
PY
du -sh "$OUT"; ls -l "$OUT/wheels"
