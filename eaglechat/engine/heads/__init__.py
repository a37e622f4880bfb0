"""EAGLE draft heads: the EAGLE-1/2 layout (eagle2.py) and the EAGLE-3 layout (eagle3.py), with what
they share (config, layer parts, checkpoint checks, folder reading/writing) in common.py.

`load_head(folder, base_model)` reads an official-format head folder and builds whichever layout its
keys describe; `save_head(head, folder)` writes either one.
"""

from __future__ import annotations

from pathlib import Path

from eaglechat.engine.heads import eagle2, eagle3
from eaglechat.engine.heads.common import HeadConfig, init_weights, read_head_files, save_head
from eaglechat.engine.heads.eagle2 import EagleHead
from eaglechat.engine.heads.eagle3 import Eagle3Config, Eagle3Head

__all__ = ["EagleHead", "Eagle3Head", "Eagle3Config", "HeadConfig", "eagle2", "eagle3", "init_weights",
           "load_head", "save_head"]


def load_head(head_dir: Path, base_model, *, base_name: str = "the base model") -> EagleHead | Eagle3Head:
    """The draft head in `head_dir` (EAGLE-1/2 or EAGLE-3, told apart by its keys) for `base_model`,
    with strict checks: each mismatch is one WeightsError line."""
    raw, state = read_head_files(head_dir)
    layout = eagle3 if eagle3.is_eagle3(raw, state) else eagle2
    return layout.build(raw, state, base_model, name=Path(head_dir).name, base_name=base_name)
