"""EAGLE draft heads: the EAGLE-1/2 layout (eagle2.py) and the EAGLE-3 layout (eagle3.py), with what
they share (config, layer parts, checkpoint checks, writing) in common.py; reading a folder (single or
sharded weights) in files.py, the published formats read into eaglechat's own layout in formats.py,
scaled RoPE in rope.py.

`load_head(folder, base_model)` reads a head folder of any published format and builds whichever
layout its keys describe; `save_head(head, folder)` writes either one in eaglechat's own layout.
"""

from __future__ import annotations

from pathlib import Path

from eaglechat.engine.heads import eagle2, eagle3, formats
from eaglechat.engine.heads.common import HeadConfig, check_head_config, init_weights, save_head
from eaglechat.engine.heads.eagle2 import EagleHead
from eaglechat.engine.heads.eagle3 import Eagle3Config, Eagle3Head
from eaglechat.engine.heads.files import read_head_files

__all__ = ["EagleHead", "Eagle3Head", "Eagle3Config", "HeadConfig", "eagle2", "eagle3", "init_weights",
           "load_head", "save_head"]


def load_head(head_dir: Path, base_model, *, base_name: str = "the base model") -> EagleHead | Eagle3Head:
    """The draft head in `head_dir` (EAGLE-1/2 or EAGLE-3, told apart by its keys) for `base_model`,
    with strict checks: each mismatch is one WeightsError line."""
    raw, state = read_head_files(head_dir)
    where = Path(head_dir) / "config.json"
    raw, state = formats.normalize(raw, state, str(where))
    check_head_config(raw, where)
    layout = eagle3 if eagle3.is_eagle3(raw, state) else eagle2
    return layout.build(raw, state, base_model, name=Path(head_dir).name, base_name=base_name)
