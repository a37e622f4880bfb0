"""Export a trained head in the official EAGLE-1 layout: config.json + model.safetensors.

The committed default head is stored in bf16 (~8 MB); load_head casts it to the base model's dtype.
The folder is written to a temporary sibling and swapped in, so readers never see half a head.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from eaglechat.engine.heads import EagleHead, save_head
from eaglechat.fit.hardware import torch_dtype
from eaglechat.train.vocab import restrict_eagle2_head


def export_head(head: EagleHead, out_dir: Path, dtype: str = "bfloat16") -> Path:
    out_dir = Path(out_dir)
    # same weights and draft vocabulary (exported as d2t offsets), in the export dtype
    copy = restrict_eagle2_head(head, head.draft_to_target).to(torch_dtype(dtype))
    tmp = out_dir.with_name(out_dir.name + ".export-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_head(copy, tmp)
    out_dir.mkdir(parents=True, exist_ok=True)
    # swap file by file: the folder may hold other files (README.md, training_summary.json)
    for name in ("model.safetensors", "config.json"):
        os.chmod(tmp / name, 0o644)
        os.replace(tmp / name, out_dir / name)
    shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
