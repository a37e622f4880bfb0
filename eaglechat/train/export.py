"""Export a trained head in the official EAGLE-1 layout: config.json + model.safetensors.

The committed default head is stored in bf16 (~8 MB); load_head casts it to the base model's dtype.
The folder is written to a temporary sibling and swapped in, so readers never see half a head.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from eaglechat.engine.head import EagleHead, save_head

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def export_head(head: EagleHead, out_dir: Path, dtype: str = "bfloat16") -> Path:
    out_dir = Path(out_dir)
    copy = EagleHead(head.config, head.embed_tokens, head.lm_head)
    copy.load_state_dict({k: v.detach().cpu() for k, v in head.state_dict().items()}, strict=False)
    if head.draft_to_target is not None:  # a reduced draft vocabulary is exported as d2t offsets
        copy.set_draft_vocab(head.draft_to_target.cpu())
    copy = copy.to(DTYPES[dtype])
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
