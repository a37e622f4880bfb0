#!/bin/sh
# Installs the torch build that fits this machine, and says which, in one line:
#   cuda  where an NVIDIA driver answers (`nvidia-smi -L` lists a GPU): PyPI's Linux wheel, the CUDA build;
#   cpu   elsewhere: the CPU wheel (`torch==V+cpu`, from a local wheel folder or pip's own index if one has it,
#         else PyTorch's CPU index), not PyPI's multi-GB CUDA build; on macOS PyPI's wheel (CPU and MPS).
# TORCH=cpu|cuda chooses, PIP names the installer (default: pip), TORCH_VERSION the version;
# DRY_RUN=1 prints the choice and the pip command instead of running it (tests/test_install.py).
set -eu
version=${TORCH_VERSION:-2.13.0}
pip=${PIP:-pip}
if [ -n "${TORCH:-}" ]; then
  why="TORCH=$TORCH"
elif gpu=$(nvidia-smi -L 2>/dev/null | head -n 1) && [ -n "$gpu" ]; then
  TORCH=cuda
  why="nvidia-smi: ${gpu%% (UUID*}"
else
  TORCH=cpu
  why="no NVIDIA driver answered; make TORCH=cuda to choose the CUDA build"
fi
cpu_index=https://download.pytorch.org/whl/cpu
case "$TORCH" in
  cuda) set -- "$pip install -q --progress-bar off torch==$version" ;;
  cpu)
    if [ "$(uname -s)" = Darwin ]; then
      set -- "$pip install -q --progress-bar off torch==$version"
    else  # a local or configured CPU wheel first (no request to PyTorch's index), then that index
      set -- "$pip install -q --progress-bar off torch==$version+cpu" \
             "$pip install -q --progress-bar off torch==$version+cpu --extra-index-url $cpu_index"
    fi ;;
  *) echo "eaglechat setup: TORCH must be cpu or cuda, got '$TORCH'" >&2; exit 2 ;;
esac
echo "eaglechat setup: torch $version, $TORCH build ($why)"
if [ -n "${DRY_RUN:-}" ]; then
  printf '%s\n' "$@"
  exit 0
fi
[ $# -eq 1 ] && exec $1
$1 2>/dev/null || $2
