"""uvicorn's h11 protocol with a deadline on request headers: a connection whose request line and
headers have not all arrived within `header_timeout` seconds is closed, with one log line (a
"slowloris" client would otherwise hold a connection open forever; uvicorn times out only idle
keep-alive connections). The body has its own deadline (ServerConfig.read_timeout).

It also tells the app how far the client has read: each request's scope carries
`extensions["eaglechat.reader_progress"]`, a function -> (bytes the client's TCP has acknowledged,
bytes written but not yet acknowledged), from the kernel's TCP_INFO and SIOCOUTQ (Linux). A streamed
reply whose client stops reading stops being acknowledged once the client's receive buffer is full,
long before the server's own send blocks (on loopback the two buffers hold megabytes:
server/reply.py's write timeout watches this instead).
"""

from __future__ import annotations

import fcntl
import logging
import socket
import struct
import termios
from typing import Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("eaglechat.server")

HEADER_TIMEOUT_S = 10.0
TCPI_BYTES_ACKED = 120  # offset of tcpi_bytes_acked (u64) in Linux's struct tcp_info (since 4.1)
ReaderProgress = Callable[[], "tuple[int, int]"]


def reader_progress(transport) -> ReaderProgress | None:
    """(acknowledged bytes, unacknowledged bytes incl. what asyncio still buffers), or None where the
    kernel does not say (not Linux, not TCP)."""
    sock = transport.get_extra_info("socket")
    if sock is None or not hasattr(socket, "TCP_INFO") or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        if len(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)) < TCPI_BYTES_ACKED + 8:
            return None
    except OSError:
        return None

    def progress() -> tuple[int, int]:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        acked = struct.unpack_from("<Q", info, TCPI_BYTES_ACKED)[0]
        queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        return acked, queued + transport.get_write_buffer_size()

    return progress


class TimedH11Protocol(H11Protocol):
    header_timeout = HEADER_TIMEOUT_S

    def connection_made(self, transport) -> None:
        self._headers_timer = None
        super().connection_made(transport)
        self._progress = reader_progress(transport)
        self._arm()

    def handle_events(self) -> None:
        scope = getattr(self, "scope", None)
        super().handle_events()
        # a new request's scope (its app task has not run yet): tell it how to read the client's progress
        if self._progress is not None and getattr(self, "scope", None) is not scope:
            self.scope.setdefault("extensions", {})["eaglechat.reader_progress"] = self._progress

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
