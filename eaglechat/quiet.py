"""Library chatter on stderr, quiet unless asked for (`--verbose`, `--debug`).

* bitsandbytes logs warnings per call or at import ("MatMul8bitLt: inputs will be cast ...", once per
  8-bit layer and forward in its training path; "Failed to load CPU gemm_4bit_forward from
  kernels-community" at import): held back unless verbose (level ERROR on its logger).
* transformers draws a "Loading weights" tqdm bar on every `from_pretrained`, and the GGUF conversion
  draws two more: kept on a terminal (loading a 7B model takes a while), dropped when stderr is not one
  (a log file or a pipe would get carriage-return garbage), unless verbose.
* `kernels` (the Hub-kernel loader bitsandbytes and transformers reach for) logs through its own logger;
  eaglechat never lets it load anything (eaglechat.hub_kernels), and its lines are held back the same way.
`configure` runs once per command (eaglechat.cli); `progress_bars()` is called where transformers loads.
"""

from __future__ import annotations

import logging
import sys

_state = {"verbose": False}
# loggers of libraries that warn at import or per call about things a user cannot act on
_CHATTY_LIBRARIES = ("bitsandbytes", "kernels")


def configure(verbose: bool) -> None:
    _state["verbose"] = bool(verbose)
    for name in _CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.ERROR)


def bars_wanted() -> bool:
    """Progress bars on stderr: on a terminal, or when verbose."""
    return _state["verbose"] or sys.stderr.isatty()


def progress_bars() -> None:
    """Before a transformers load: its bars only on a terminal, or when verbose."""
    from transformers.utils import logging as hf_logging

    if bars_wanted():
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
