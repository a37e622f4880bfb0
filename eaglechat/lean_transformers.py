"""transformers without scipy: an import a single-device decode never uses, kept out of every start.

Loading any model class makes transformers (5.x) import its loss functions, and the object-detection
ones import `scipy.optimize` (about 0.4 s of a 2-core machine's start) whenever `is_scipy_available()`
answers True. transformers supports environments without scipy and skips that import when the check
answers False; the check is a `functools.lru_cache`d function, and `prepare()` fills its cache with False
for this process. eaglechat never computes a detection loss; nothing else in transformers' loading or
decoding path asks.

What stays, because transformers needs it at import (measured with `eaglechat bench --startup
MODEL --importtime`): torch._dynamo, which `transformers.masking_utils` imports for one name and its
continuous-batching cache through `torch.compiler.disable` decorators, and with it sympy and
`torch.distributed.tensor`.
"""

from __future__ import annotations

import sys

# the module whose import-time branch reads the check: once it has loaded, prepare() changes nothing
ASKER = "transformers.loss.loss_for_object_detection"


def prepare() -> None:
    """Before transformers' modeling modules load: its scipy check answers False for this process.
    Imports transformers' utils, which loading any model needs next anyway."""
    if ASKER in sys.modules:
        return
    from transformers.utils import import_utils

    check = import_utils.is_scipy_available
    check.cache_clear()
    real = import_utils._is_package_available
    import_utils._is_package_available = lambda *_args, **_kwargs: (False, "N/A")
    try:
        check()
    finally:
        import_utils._is_package_available = real
