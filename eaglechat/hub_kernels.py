"""No kernels fetched from the Hugging Face Hub: eaglechat never runs code it did not ship.

bitsandbytes' CPU backend (0.50) calls `kernels.get_kernel("kernels-community/quantization-bitsandbytes")`
at import on CPUs with AVX512-BF16: online that downloads and loads a compiled kernel from the Hub, offline
it logs "Skipping publisher trust check ..." on stderr. transformers (5.25) kernelizes every
`from_pretrained` model with Hub kernels by default, which would also change the numerics the exactness
tests pin. (Its integration module is still imported, by transformers' activations; what it would
import of `torch.distributed.tensor` is kept out by eaglechat/lean_transformers.py.) Two switches turn the kernels off the way the libraries'
authors allow: transformers' own `USE_HUB_KERNELS=NO` (transformers/integrations/hub_kernels.py), and the `kernels` package marked absent in `sys.modules`, so
`importlib.util.find_spec("kernels")` answers None, `import kernels` raises ImportError, and bitsandbytes
falls back to the kernels in its own wheel (saying so at WARNING on its own logger, which
`eaglechat.quiet` holds back).
"""

from __future__ import annotations

import os
import sys


def refuse() -> None:
    """Make `kernels` unimportable for this process, unless something imported it already."""
    os.environ["USE_HUB_KERNELS"] = "NO"
    sys.modules.setdefault("kernels", None)  # type: ignore[arg-type]
