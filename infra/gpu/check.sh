#!/usr/bin/env bash
# The GPU check: reader (T5-base from scratch, minilm-bert2bert), DeepSpeed ZeRO-2/3, kill-and-resume,
# Eq. 3 scoring, passage embeddings, BPR steps -- all through the launched entry points; prints one JSON.
#   infra/gpu/check.sh [--device cuda|cpu] [--tiny]         (≤ 8 min on one H100; --device cpu --tiny: ~2 min)
# Wheels the GPU image lacks (deepspeed, ...) are installed from .whl/wheels (infra/gpu/fetch_wheels.sh),
# only those whose distribution is missing. No MLflow, Prefect, bm25s, polars or faiss is needed.
set -euo pipefail
cd "$(dirname "$0")/../.."
CARRY=${FUNNELRAG_CARRY:-.whl}
if [ -d "$CARRY/wheels" ]; then
  for whl in "$CARRY"/wheels/*.whl; do
    [ -e "$whl" ] || continue
    dist=$(basename "$whl" | cut -d- -f1)
    if ! python -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null; then
      python -m pip install -q --no-deps --no-index "$whl"
    fi
  done
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DS_BUILD_OPS=0 DS_SKIP_CUDA_CHECK=1
exec python -m infra.gpu.check --carry "$CARRY" "$@"
