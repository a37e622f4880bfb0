"""The chat pane: the open conversation's log, the prompt, and the turn being written.

The pane owns everything about one conversation on screen: opening it (the latest messages mounted
at once, earlier ones as the reader scrolls up), what enter does (refuse a message that cannot be
answered now, saying why; store it; start the `ChatTurn` that answers it), the turn's end, and the
versions of the last turn (ctrl+r, f9, alt+left/right). It never calls into the app: the app sets
what it decides (the engine, the model's name, the speculation and thinking switches, the keymap)
on the pane, and the pane posts what the app needs to hear (`TurnStarted`, `TurnProgress`, one
`TurnEnded`, `ConversationsChanged`). The versions of the last turn are tui/versions.py's. The same direction as elia's `Chat` widget
(darrenburns/elia, elia_chat/widgets/chat.py: the chat posts `AgentResponseComplete` up).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message

from eaglechat.chat import settings
from eaglechat.chat.history import open_slot, when
from eaglechat.chat.store import Conversation, ConversationGone, Store, StoreError
from eaglechat.chat.store import Message as StoredMessage
from eaglechat.engine.protocol import Engine, GenerationParams, Speculate
from eaglechat.models import sampling as sampling_defaults
from eaglechat.tui.generation import DRAIN_HZ
from eaglechat.tui.keys import placeholder
from eaglechat.tui.stats import TurnNumbers
from eaglechat.tui.turn import ChatTurn, TurnDone, TurnFailed
from eaglechat.tui.versions import LastTurnVersions
from eaglechat.tui.widgets import ChatLog, EarlierMessages, MessageView, PromptInput

PAGE = 20  # messages mounted at a time: the latest when a conversation opens, more as the reader scrolls up


class ChatPane(Vertical):
    # -- what the pane tells the app ----------------------------------------------------------------

    class TurnStarted(Message):
        """A reply began (the app turns the stop key on and shows live figures)."""

    class TurnProgress(Message):
        """Text or prompt-reading progress arrived: the turn's figures so far."""

        def __init__(self, numbers: TurnNumbers) -> None:
            super().__init__()
            self.numbers = numbers

    class TurnEnded(Message):
        """The reply is over: stored, rendered, said. `numbers` is None when there is nothing to
        show for it (stopped before it began); `stop_reason` is "" after an engine error."""

        def __init__(self, numbers: TurnNumbers | None, stop_reason: str) -> None:
            super().__init__()
            self.numbers, self.stop_reason = numbers, stop_reason

    class ConversationsChanged(Message):
        """A conversation was stored, titled or stored again: the list of them changed."""

    # -- what the app sets ------------------------------------------------------------------------

    engine: Engine | None = None
    model_name: str = ""
    speculate: Speculate = Speculate.AUTO  # F5 cycles auto -> on -> off; a load sets the engine's default
    thinking: bool = True  # a reasoning model thinks before it answers (its template's enable_thinking)
    draft_colours: bool = False
    keymap: dict[str, str] = {}
    loading: str | None = None  # the model a load or pull is running for
    send_when_loaded: bool = False  # enter was pressed while the model loaded

    def __init__(self, store: Store, *, settings_path: Path | None, clock: Callable[[], float],
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.store = store
        self.settings_path = settings_path
        self.clock = clock
        self.conversation: Conversation | None = None
        self.turn: ChatTurn | None = None  # the reply being written
        self.context_tokens: int | None = None  # the open conversation's prompt size, when known
        self._earlier: list[StoredMessage] = []  # messages of the conversation not mounted yet, oldest first
        self._timer = None
        self.versions = LastTurnVersions(self)

    def compose(self) -> ComposeResult:
        yield ChatLog(id="log")
        yield PromptInput(id="prompt", placeholder=placeholder({}))

    @property
    def log_view(self) -> ChatLog:
        return self.query_one(ChatLog)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def generating(self) -> bool:
        return self.turn is not None

    def notify(self, message: str, *, title: str = "", severity="information", timeout=None,
               markup: bool = False) -> None:
        """Notifications carry engine and file-system text: no markup unless asked for."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def stamp(self, created: float | None) -> str:
        return when(created, self.clock()) if created else ""

    def set_keymap(self, keymap: dict[str, str]) -> None:
        self.keymap = keymap
        self.prompt.placeholder = placeholder(keymap)

    # -- opening a conversation -------------------------------------------------------------------

    async def open(self, conversation_id: int | None) -> None:
        """Show a conversation (None: a new one, stored with its first message). Only the latest PAGE
        messages are mounted: a conversation of hundreds opens at once, the rest follow on scrolling up."""
        self.conversation = self.store.conversation(conversation_id) if conversation_id else None
        records = self.store.messages(self.conversation.id) if self.conversation is not None else []
        self._earlier, latest = records[:-PAGE], records[-PAGE:]
        log = self.log_view
        await log.remove_children()
        if self._earlier:
            await log.mount(EarlierMessages(len(self._earlier)))
        await log.mount_all([self._view(m) for m in latest])
        log.anchor()
        # Up recalls this conversation's messages first, then the latest of the others
        here = [m.content for m in records if m.role == "user"]
        others = self.store.recent_user_messages(exclude=self.conversation.id if self.conversation else None)
        self.prompt.sent = [m for m in others if m not in here] + here
        self.count_context()
        self.versions.show()

    def _view(self, m: StoredMessage) -> MessageView:
        view = MessageView(m.role, m.content, runs=m.stats.get("runs"), meta=m.stats.get("meta", ""),
                           message_id=m.id, stamp=self.stamp(m.created), reasoning=m.reasoning)
        view.set_class(self.draft_colours and bool(view.runs), "-drafts")
        return view

    async def on_chat_log_reached_top(self, message: ChatLog.ReachedTop) -> None:
        if self.log_view.scroll_y <= 0:  # still there (not a passing zero while a conversation is laid out)
            await self.mount_earlier()

    async def mount_earlier(self) -> None:
        """Mount the previous PAGE messages above the first one shown, keeping that one in view."""
        if not self._earlier:
            return
        log = self.log_view
        page, self._earlier = self._earlier[-PAGE:], self._earlier[:-PAGE]
        first = next(iter(log.query(MessageView)), None)
        marker = log.query(EarlierMessages)
        views = [self._view(m) for m in page]
        await log.mount_all(views, before=first) if first is not None else await log.mount_all(views)
        if self._earlier:
            marker.first().count = len(self._earlier)
        else:
            await marker.remove()
        if first is not None:
            self.call_after_refresh(log.scroll_to_widget, first, top=True, animate=False)

    def shown_messages(self) -> list[tuple[str, str, str, dict | None]]:
        """(role, content, reasoning, stats) of every message of the conversation on this window, the
        ones not mounted yet included."""
        out = [(m.role, m.content, m.reasoning, m.stats) for m in self._earlier]
        for view in self.query(MessageView):
            stats = {"runs": view.runs, "meta": view.meta} if view.role == "assistant" else None
            out.append((view.role, view.content, view.reasoning, stats))
        return out

    def count_context(self) -> None:
        """The open conversation's prompt size for the gauge (before its first turn here)."""
        count = getattr(self.engine, "count_tokens", None)
        self.context_tokens = None
        if count is None or self.conversation is None:
            return
        messages = self._engine_messages()
        if any(m["role"] == "user" for m in messages):
            try:
                self.context_tokens = count(messages)
            except Exception:  # noqa: BLE001
                self.context_tokens = None

    def _engine_messages(self) -> list[dict]:
        """The conversation as the engine reads it: the answers without their reasoning."""
        conv = self.conversation
        messages = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        messages += [{"role": m.role, "content": m.content} for m in self.store.messages(conv.id)
                     if m.role in ("user", "assistant")]
        return messages

    def show_drafts(self, on: bool) -> None:
        self.draft_colours = on
        for view in self.query(MessageView):
            if view.role == "assistant":
                view.show_drafts(on)

    def focus_prompt(self) -> None:
        self.screen.set_focus(self.prompt)

    def scroll_pages(self, pages: int) -> None:
        log = self.log_view
        if pages < 0 and log.scroll_y <= 0:  # already at the top (a page too short to scroll): earlier ones
            self.call_later(self.mount_earlier)
        log.scroll_to(y=log.scroll_y + pages * max(1, log.scrollable_content_region.height - 2), animate=False)

    # -- the conversation in the history ------------------------------------------------------------

    def conversation_alive(self) -> bool:
        """The open conversation is still in the history. Its creation time is checked with its id:
        SQLite may give a deleted conversation's id to the next new one (another window's)."""
        conv = self.conversation
        stored = self.store.conversation(conv.id) if conv is not None else None
        return stored is not None and stored.created == conv.created

    def recreate_conversation(self, but: MessageView | None = None) -> Conversation:
        """The open conversation was deleted in another window: store it again, with every message
        this window holds (all but `but`, which its owner saves itself), as a new conversation."""
        old = self.conversation
        conv = self.store.new_conversation(old.title, model=old.model, system_prompt=old.system_prompt,
                                           temperature=old.temperature, top_p=old.top_p,
                                           max_new_tokens=old.max_new_tokens)
        earlier = len(self._earlier)
        for i, view in enumerate([*self._earlier, *self.query(MessageView)]):
            if view is but or view.role not in ("user", "assistant") or not view.content:
                continue
            stats = view.stats if i < earlier else (
                {"runs": view.runs, "meta": view.meta} if view.role == "assistant" else None)
            stored = self.store.add_message(conv.id, view.role, view.content, stats=stats,
                                            reasoning=view.reasoning)
            if i >= earlier:
                view.message_id = stored.id
        self._earlier = []  # stored again under new ids: kept on screen from here (rare: a deleted conversation)
        self.conversation = conv
        self.notify(f"“{old.title}” was deleted in another window; what this window shows is saved again "
                    "as a new conversation.", severity="warning", timeout=10)
        self.post_message(self.ConversationsChanged())
        return conv

    # -- sending ------------------------------------------------------------------------------------

    async def on_prompt_input_submitted(self, message: PromptInput.Submitted) -> None:
        message.stop()
        await self.send(message.text, from_prompt=True)

    def engine_ready(self, engine: Engine, model_name: str) -> None:
        """A model was loaded: used from the next reply on; a message waiting for it is sent now."""
        self.engine, self.model_name, self.loading = engine, model_name, None
        self.speculate = Speculate.of(engine.info.speculate_by_default)
        self.count_context()
        if self.send_when_loaded:  # enter was pressed on the loading screen
            self.send_when_loaded = False
            if self.prompt.text.strip():
                self.call_later(self.send, self.prompt.text, from_prompt=True)

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
        if self.loading is not None and self.engine is None and from_prompt:
            self.send_when_loaded = True  # typed on the loading screen: sent once the model is there
            self.notify(f"Sent as soon as {self.loading} is loaded; it stays in the prompt until then",
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
        if from_prompt:  # before any await: keys typed after enter stay in the prompt
            self.prompt.take(text)
        self.prompt.sent.append(text)
        self.post_message(self.ConversationsChanged())
        await self.log_view.mount(MessageView("user", text, message_id=stored.id, stamp=self.stamp(self.clock())))
        await self.start_turn(slot=stored.slot, version=stored.version)

    def _store_user_message(self, text: str) -> StoredMessage:
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

    # -- the turn -----------------------------------------------------------------------------------

    def model_sampling(self) -> dict:
        """The loaded model's own sampling defaults (EngineInfo.sampling; {} while none is loaded)."""
        return dict(self.engine.info.sampling) if self.engine is not None else {}

    def new_conversation_settings(self) -> dict:
        """A new conversation's settings: the user's defaults (settings.yaml), else the model's own
        temperature and top-p."""
        own = {k: v for k, v in self.model_sampling().items() if k in ("temperature", "top_p")}
        return {**own, **settings.conversation_defaults(self.settings_path)}

    def generation_params(self) -> GenerationParams:
        conv = self.conversation
        switch = getattr(self.engine.info, "thinking_switch", False)
        # the conversation says temperature and top-p; the model's own top-k and repetition penalty fill
        # the rest (none under temperature 0: greedy as asked)
        return sampling_defaults.fill(
            GenerationParams(temperature=conv.temperature, top_p=conv.top_p, max_new_tokens=conv.max_new_tokens,
                             speculate=self.speculate, thinking=self.thinking if switch else None),
            self.model_sampling(), given=("temperature", "top_p"))

    async def start_turn(self, *, slot: int | None = None, version: int = 0) -> None:
        """Reply to the conversation as stored (its last message is the user's)."""
        log = self.log_view
        reply = MessageView("assistant", "", stamp=self.stamp(self.clock()))
        await log.mount(reply)
        reply.set_class(self.draft_colours, "-drafts")
        reply.start_stream()
        log.anchor()
        self.turn = ChatTurn(self, self.engine, reply, self._engine_messages(), self.generation_params(),
                             slot=slot, version=version)
        self.turn.start()
        self._timer = self.set_interval(1 / DRAIN_HZ, self._drain)
        self.post_message(self.TurnStarted())

    def _drain(self) -> None:
        """Timer tick: render what arrived; at the end, finish the turn (as its own callback, so the
        final render is not awaited inside the timer)."""
        turn = self.turn
        if turn is None or self._timer is None:
            return
        changed, final = turn.drain()
        if final is None:
            if changed:
                self.post_message(self.TurnProgress(turn.numbers))
            return
        self._timer.stop()
        self._timer = None
        self.call_later(self._end_turn, turn, final)

    async def _end_turn(self, turn: ChatTurn, final: TurnDone | TurnFailed) -> None:
        if turn.ended or not turn.reply.is_attached:  # the app is closing: `abandon` saved the reply
            return
        numbers = await turn.end(final)
        self.turn = None
        if numbers is not None:
            self.context_tokens = numbers.context_tokens or self.context_tokens
        self.versions.show()
        stop_reason = final.finished.stop_reason if isinstance(final, TurnDone) else ""
        self.post_message(self.TurnEnded(numbers, stop_reason))

    def stop(self) -> bool:
        """esc: the engine stops at its next decode step. True when a reply was being written."""
        if self.turn is None:
            return False
        self.turn.cancel.set()
        return True

    def abandon(self, why: str) -> None:
        """Quitting: the reply being written is stored as it is, marked stopped."""
        if self.turn is not None:
            self._timer = None
            self.turn.abandon(why)
