"""eaglechat: fast, exact local chat with EAGLE-2 speculative decoding."""

__version__ = "0.1.0"
