"""`eaglechat serve`: the OpenAI-compatible API over any Engine (eaglechat/engine/protocol.py)."""

from eaglechat.server.app import create_app

__all__ = ["create_app"]
