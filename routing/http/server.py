"""How uvicorn serves the routing service: connection limits and the request-head deadline.

uvicorn closes idle keep-alive connections (`timeout_keep_alive`) and, with
h11, bounds the request head's size (`h11_max_incomplete_event_size`), but it
puts no time limit on a request head: a client that connects and sends
nothing, or trickles its headers a byte at a time, holds a connection for
ever. `head_guarded_protocol` is uvicorn's httptools protocol with both: the
request line and headers must arrive within `limits.header_timeout_s` (else
408 and the connection is closed) and stay within `limits.max_header_bytes`
(else 431). The body's deadline is the request guard's (routing.http.guard).
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from routing.config import RouterConfig


class _HeadTooLarge(Exception):
    """Raised in a parser callback: httptools stops and uvicorn calls send_400_response."""


def head_guarded_protocol(*, header_timeout_s: float, max_header_bytes: int) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline and a size limit on each request head."""

    class HeadGuardedProtocol(HttpToolsProtocol):
        _head_timer = None  # armed while a request head is awaited or arriving
        _head_bytes = 0  # bytes received since the head began, while it is incomplete
        _parsed_bytes = 0  # bytes of the head's URL and headers parsed so far
        _too_large = False

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()  # a connection that sends nothing is closed too

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            # Still inside a head after the whole chunk was parsed: every byte of it was head.
            if self._head_timer is not None and not self.transport.is_closing():
                self._head_bytes += len(data)
                if self._head_bytes > max_header_bytes:
                    self._refuse(b"431 Request Header Fields Too Large",
                                 b"request head above %d bytes" % max_header_bytes)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._parsed_bytes = 0
            if self._head_timer is None:
                self._arm()

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def send_400_response(self, msg: str) -> None:
            if self._too_large:
                self._refuse(b"431 Request Header Fields Too Large", b"request head above %d bytes" % max_header_bytes)
            else:
                super().send_400_response(msg)

        def _count(self, n: int) -> None:
            # A complete head that arrived in one chunk: counted as httptools parses it.
            self._parsed_bytes += n
            if self._parsed_bytes > max_header_bytes:
                self._too_large = True
                raise _HeadTooLarge

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def _arm(self) -> None:
            self._head_bytes = 0
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            self._refuse(b"408 Request Timeout", b"request head not received within %g s" % header_timeout_s)

        def _refuse(self, status: bytes, message: bytes) -> None:
            self._disarm()
            if not self.transport.is_closing():
                self.transport.write(b"HTTP/1.1 %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
                                     b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                                     % (status, len(message), message))
                self.transport.close()

    return HeadGuardedProtocol


def uvicorn_options(config: RouterConfig) -> dict:
    """uvicorn.run / uvicorn.Config keyword arguments for the service's limits."""
    limits = config.limits
    return {
        "http": head_guarded_protocol(header_timeout_s=limits.header_timeout_s,
                                      max_header_bytes=limits.max_header_bytes),
        "timeout_keep_alive": limits.keep_alive_s,
        "h11_max_incomplete_event_size": limits.max_header_bytes,  # the same bound if run with h11
        "limit_concurrency": limits.max_connections,
    }
