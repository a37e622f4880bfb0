import os
import sys
from pathlib import Path

# tests import their helpers (tiny_models, fake_engine, ...) directly
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

# the tiny test models run fastest on one thread (and steadiest on a shared 2-core machine)
torch.set_num_threads(1)
