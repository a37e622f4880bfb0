"""What enter does: refuse a message that cannot be answered now (saying why; it stays in the prompt),
store it (in a new conversation, or again when another window deleted this one; a history that cannot
be written keeps it in the prompt), and start the `ChatTurn` that answers it. A mixin of EagleChatApp."""

from __future__ import annotations

from eaglechat.chat import settings
from eaglechat.chat.history import open_slot
from eaglechat.chat.store import (
    Conversation,
    ConversationGone,
    Message,
    Store,
    StoreError,
)
from eaglechat.engine.protocol import Engine, GenerationParams
from eaglechat.models import sampling as sampling_defaults
from eaglechat.tui.stats import TurnNumbers, speedup
from eaglechat.tui.turn import ChatTurn
from eaglechat.tui.widgets import ChatLog, MessageView, PromptInput


class Sending:
    # what this mixin uses of EagleChatApp (set in its __init__)
    store: Store
    engine: Engine | None
    conversation: Conversation | None
    chat_turn: ChatTurn | None
    model_name: str
    speculate: bool | str  # True, False or "auto"
    draft_colours: bool
    baseline: float | None
    _loading: str | None
    _send_when_loaded: bool
    _slow_hint_for: str | None

    async def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        await self.send(message.text, from_prompt=True)

    def _refusal(self, text: str) -> str | None:
        if self.engine is None:
            return "No model loaded. Choose one with ctrl+o."
        if self.generating:
            return "Still writing the last reply (esc stops it); your message stays in the prompt"
        count = getattr(self.engine, "count_tokens", None)  # engines that can tokenise locally
        if count is not None:
            system = self.conversation.system_prompt if self.conversation else ""
            alone = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
            try:
                tokens = count(alone)
            except Exception:  # noqa: BLE001 - the engine will say it when generating
                return None
            limit = self.engine.info.max_context
            if tokens + 1 > limit:
                return (f"This message is {tokens} tokens with the system prompt; {self.model_name}'s context "
                        f"holds {limit}. Shorten it: it stays in the prompt.")
        return None

    async def send(self, text: str, *, from_prompt: bool = False) -> None:
        if self._loading is not None and self.engine is None and from_prompt:
            self._send_when_loaded = True  # typed on the loading screen: sent once the model is there
            self.notify(f"Sent as soon as {self._loading} is loaded; it stays in the prompt until then",
                        timeout=5)
            return
        refusal = self._refusal(text)
        if refusal:
            self.notify(refusal, severity="warning" if self.engine is not None else "error")
            return
        try:
            stored = self._store_user_message(text)
        except StoreError as exc:  # nothing was stored: the text stays where it was typed
            self.notify(f"Not sent: {exc}. Your message stays in the prompt.", severity="error", timeout=15)
            return
        prompt = self.query_one(PromptInput)
        if from_prompt:  # before any await: keys typed after enter stay in the prompt
            prompt.take(text)
        prompt.sent.append(text)
        await self.refresh_sidebar()
        await self.query_one(ChatLog).mount(MessageView("user", text, message_id=stored.id,
                                                        stamp=self.stamp(self.clock())))
        await self._start_turn(slot=stored.slot, version=stored.version)

    def model_sampling(self) -> dict:
        """The loaded model's own sampling defaults (EngineInfo.sampling; {} while none is loaded)."""
        return dict(self.engine.info.sampling) if self.engine is not None else {}

    def new_conversation_settings(self) -> dict:
        """A new conversation's settings: the user's defaults (settings.yaml), else the model's own
        temperature and top-p."""
        own = {k: v for k, v in self.model_sampling().items() if k in ("temperature", "top_p")}
        return {**own, **settings.conversation_defaults(self.settings_path)}

    def _store_user_message(self, text: str) -> Message:
        """Store the message in the open conversation (a new one when there is none; again, from what
        is on screen, when another window deleted it)."""
        if self.conversation is None:
            self.conversation = self.store.new_conversation(model=self.model_name, **self.new_conversation_settings())
        elif not self.conversation_alive():
            self.recreate_conversation()
        conv = self.conversation
        if conv.title == "New chat" and not self.store.messages(conv.id):
            title = " ".join(text.split())[:80] or "New chat"
            self.conversation = conv = self.store.rename(conv.id, title) or conv
        slot, version = open_slot(self.store, conv.id) or (None, 0)  # the edit of a turn taken back (f9)
        try:
            return self.store.add_message(conv.id, "user", text, slot=slot, version=version)
        except ConversationGone:  # deleted between the look and the write
            self.recreate_conversation()
            return self.store.add_message(self.conversation.id, "user", text)

    async def _start_turn(self, *, slot: int | None = None, version: int = 0) -> None:
        """Reply to the conversation as stored (its last message is the user's)."""
        conv = self.conversation
        messages = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        messages += [{"role": m.role, "content": m.content} for m in self.store.messages(conv.id)
                     if m.role in ("user", "assistant")]

        log = self.query_one(ChatLog)
        reply = MessageView("assistant", "", stamp=self.stamp(self.clock()))
        await log.mount(reply)
        reply.set_class(self.draft_colours, "-drafts")
        reply.start_stream()
        log.anchor()

        # the conversation says temperature and top-p; the model's own top-k and repetition penalty fill
        # the rest (none under temperature 0: greedy as asked)
        params = sampling_defaults.fill(
            GenerationParams(temperature=conv.temperature, top_p=conv.top_p, max_new_tokens=conv.max_new_tokens,
                             speculate=self.speculate),
            self.model_sampling(), given=("temperature", "top_p"))
        self.chat_turn = ChatTurn(self, reply, messages, params, slot=slot, version=version)
        self.refresh_bindings()
        self.update_status()
        self.chat_turn.start()

    async def on_chat_turn_ended(self, message: ChatTurn.Ended) -> None:
        await message.turn.end(message.final)

    def turn_measured(self, numbers: TurnNumbers, stop_reason: str) -> None:
        """A finished turn's speed: a plain turn is the baseline, a speculative one is compared with it.
        A turn under speculation auto is neither: the engine measured both modes and kept the faster."""
        measured = numbers.measurable and stop_reason != "cancelled" and self.engine is not None
        if numbers.auto:
            return
        if measured and not numbers.speculate:
            self.baseline = numbers.compare_tps()
            try:
                self.store.set_baseline(self.model_name, self.baseline, self.engine.info.device)
            except StoreError:  # only a figure; the reply's own save says when the history fails
                pass
        elif measured:
            self._hint_if_speculation_is_slower(numbers)

    def _hint_if_speculation_is_slower(self, numbers: TurnNumbers) -> None:
        """The chat's own measurement says plain decoding is faster here: say so once per model, and
        offer the switch (the choice stays the user's: a different prompt can turn it around)."""
        ratio = speedup(numbers.compare_tps(), self.baseline)
        if ratio is None or ratio >= 1.0 or self._slow_hint_for == self.model_name:
            return
        self._slow_hint_for = self.model_name
        self.notify(f"Speculation ran at {ratio:.2f}× the plain-decoding speed measured here "
                    f"(τ {numbers.final_tau() or 0:.2f}): plain decoding is faster on this machine. "
                    "F5 switches speculation off.", severity="warning", timeout=12)
