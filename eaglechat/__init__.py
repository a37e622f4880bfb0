"""eaglechat: fast, exact local chat with EAGLE-2 speculative decoding."""

from eaglechat import hub_kernels

__version__ = "0.1.0"

# before transformers or bitsandbytes is imported anywhere in the process
hub_kernels.refuse()
