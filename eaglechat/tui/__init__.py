"""The Textual chat app. Depends on the engine only through eaglechat.engine.protocol."""
