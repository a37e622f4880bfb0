"""Incremental detokenization: text deltas that are correct across token boundaries.

Decoding tokens one at a time breaks multi-byte characters (a half UTF-8 sequence decodes to U+FFFD)
and loses SentencePiece leading spaces. So each delta is the difference between decoding a short
window that starts a few tokens back and decoding the same window without the new tokens; text is
held back while it ends in an incomplete character. (The scheme of text-generation-inference.)
Special tokens are skipped, but where they carry the reply's structure (`keep_special`: the harmony
format's channel markers, engine/harmony.py) they stay in the text for the reasoning splitter.
"""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer, keep_special: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = not keep_special
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special, clean_up_tokenization_spaces=False)

    def add(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        before = self._decode(self.ids[self.prefix_offset:self.read_offset])
        after = self._decode(self.ids[self.prefix_offset:])
        if after.endswith("\ufffd") or len(after) <= len(before) or not after.startswith(before):
            return ""  # an incomplete character, or nothing visible yet: wait for more tokens
        delta = after[len(before):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Whatever is still held back (e.g. a reply that ends inside a character)."""
        full = self._decode(self.ids)
        if full.startswith(self.text) and len(full) > len(self.text):
            delta = full[len(self.text):]
            self.text = full
            return delta
        return ""
