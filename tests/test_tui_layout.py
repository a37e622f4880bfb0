"""How the chat app is put together: the app's mixins declare what they use of it, and the chat pane
and its turn never reach up into the app."""

from __future__ import annotations

import ast
import inspect

import pytest
from textual.app import App
from textual.containers import Vertical

from eaglechat.tui import control, conversations, models, pane, turn, versions


def self_members(cls) -> set[str]:
    """Every `self.NAME` a class's own code reads or writes."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    functions = [node for node in body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return {node.attr for function in functions for node in ast.walk(function)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"}


def declared(cls) -> set[str]:
    own = set(vars(cls)) | set(getattr(cls, "__annotations__", {}))
    return own | {name for klass in cls.__mro__[1:] for name in dir(klass)}


class Sloppy:
    known: int

    def f(self):
        return self.known + self.unknown


@pytest.mark.parametrize("mixin", [control.Control, conversations.ConversationActions, models.ModelActions],
                         ids=lambda c: c.__name__)
def test_each_mixin_declares_what_it_uses_of_the_app(mixin):
    undeclared = self_members(mixin) - declared(mixin) - set(dir(App))
    assert not undeclared, f"{mixin.__name__} uses undeclared members of the app: {sorted(undeclared)}"


def test_the_check_sees_an_undeclared_member():
    assert self_members(Sloppy) - declared(Sloppy) - set(dir(App)) == {"unknown"}


def test_the_pane_and_the_turn_never_reach_into_the_app():
    """Data goes down (the app sets the pane's attributes), messages go up (TurnEnded and co)."""
    for module in (pane, turn, versions):
        source = inspect.getsource(module)
        assert "self.app" not in source and "EagleChatApp" not in source, module.__name__
    used = self_members(pane.ChatPane) - set(dir(Vertical))
    assert used <= declared(pane.ChatPane) | set(vars(pane.ChatPane(None, settings_path=None, clock=float))), \
        sorted(used - declared(pane.ChatPane))
    assert self_members(turn.ChatTurn) <= set(vars(turn.ChatTurn)) | {
        "owner", "engine", "reply", "messages", "params", "slot", "version", "cancel", "numbers", "buffer",
        "unsaved", "ended", "_saved_at", "_thread"}
