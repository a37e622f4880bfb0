"""Conversations: the SQLite store and the small settings file the chat app remembers."""
