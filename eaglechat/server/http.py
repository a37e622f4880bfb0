"""uvicorn's h11 protocol with a deadline on request headers: a connection whose request line and
headers have not all arrived within `header_timeout` seconds is closed, with one log line (a
"slowloris" client would otherwise hold a connection open forever; uvicorn times out only idle
keep-alive connections). The body has its own deadline (ServerConfig.read_timeout)."""

from __future__ import annotations

import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("eaglechat.server")

HEADER_TIMEOUT_S = 10.0


class TimedH11Protocol(H11Protocol):
    header_timeout = HEADER_TIMEOUT_S

    def connection_made(self, transport) -> None:
        self._headers_timer = None
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        if self._headers_timer is None and self.conn.their_state is h11.IDLE:
            self._headers_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._headers_timer is not None:
            self._headers_timer.cancel()
            self._headers_timer = None

    def data_received(self, data: bytes) -> None:
        self._arm()  # a keep-alive connection's next request starts its own deadline
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the headers are in
            self._disarm()

    def _headers_late(self) -> None:
        self._headers_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self.conn.trailing_data[0]:  # a request had begun: say so (an idle connection just ends)
                log.warning("a client sent part of its request headers and nothing more for %.0f s: "
                            "connection closed", self.header_timeout)
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)


def timed_h11(header_timeout: float) -> type:
    return type("TimedH11Protocol", (TimedH11Protocol,), {"header_timeout": header_timeout})
