"""One HTTP/2 connection, both directions: frames -> streams -> exchanges.

Each stream is one exchange: the request's HEADERS start it, the response's
END_STREAM (DATA or trailers, or a Trailers-Only HEADERS) completes it,
RST_STREAM or a GOAWAY that leaves it unprocessed cancels it, the
connection's close abandons what is left. Streams interleave freely.

Who is the client is learnt from the bytes, not assumed: the connection
preface, or the first header block that carries request pseudo-headers
(``:method``, ``:path``...) or ``:status``. The session works from either
side (the traced process may be the client or the server).

Joining late (the connection began before the agent): no preface, and HPACK
tables the agent never saw being built. Decoding carries on with
:class:`~protocols.http2.hpack_state.TolerantDecoder`: fields that refer to
entries older than the agent are counted as unknown on the message
(``unknown_fields``) and the span says so. Streams already open when the
agent joined (their request was never seen) are skipped.

Captured bytes may be cut (``missing``): a cut inside a DATA payload is
counted and skipped; one that loses a frame boundary stops parsing until a
later write starts with a plausible frame header, and makes the HPACK table
of that direction untrusted (an insertion may have been lost).

``Upgrade: h2c``: the HTTP/1.1 request that asks for it is stream 1's
request; after ``101 Switching Protocols`` both directions speak HTTP/2.
When the server declines, the connection stays HTTP/1.1 and is handed, with
the bytes seen so far, to an HTTP/1 session (its exchanges are http1's).
"""

from __future__ import annotations

import re

from hyperframe.exceptions import HyperframeError
from hyperframe.frame import Frame, SettingsFrame

from protocols.base import (
    Direction,
    ExchangeCompleted,
    ExchangeKind,
    ExchangeProgress,
    ExchangeStarted,
    Outcome,
    Phase,
    ProgressFilter,
    SessionEvent,
    abandon,
)
from protocols.http2.frames import (
    CONTINUATION,
    DATA,
    FLAG_ACK,
    FLAG_END_HEADERS,
    FLAG_END_STREAM,
    FLAG_PADDED,
    FLAG_PRIORITY,
    GOAWAY,
    HEADERS,
    HEADER_LEN,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    check_unread,
    frames_plausible,
    read_header,
    read_u32,
)
from protocols.http2.hpack_state import TolerantDecoder
from protocols.http2.types import PREFACE, PROTOCOL, Http2Exchange, Http2Message

#: Control frames (anything but DATA) larger than this are skipped, not buffered.
MAX_CONTROL_FRAME = 65536
#: Header blocks spread over CONTINUATION frames are cut at this size.
MAX_HEADER_BLOCK = 262144
#: HEADERS flags after which the payload is more than the header block fragment.
_PAD_OR_PRIORITY = FLAG_PADDED | FLAG_PRIORITY
#: After this many parse errors the session stops parsing the connection.
MAX_PARSE_ERRORS = 64
_REQUEST_PSEUDO = frozenset({":method", ":path", ":scheme", ":authority", ":protocol"})
#: An HTTP/1.1 request line: a connection that opens with one asks for ``Upgrade: h2c``.
REQUEST_LINE = re.compile(rb"^[A-Z]{3,10} \S+ HTTP/1\.1\r\n")
#: How many bytes of the HTTP/1.1 upgrade exchange are kept, at most.
MAX_UPGRADE_BYTES = 65536


class _Side:
    """Frame state of one direction."""

    __slots__ = ("buf", "decoder", "started", "data_left", "data_stream", "data_flags", "desynced", "block", "lost_ns")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.decoder = TolerantDecoder(complete=False)
        self.started = False  # any byte seen in this direction
        self.data_left = 0  # payload bytes of the current DATA frame still to come
        self.data_stream = 0
        self.data_flags = 0
        self.desynced = False
        #: A header block waiting for CONTINUATION: [stream id, flags, bytes, is_push].
        self.block: list | None = None
        #: When bytes that may have held a request were lost (0: none since the last request seen).
        self.lost_ns = 0


class Http2Session:
    """``Session`` of protocols/base.py for HTTP/2 (prior knowledge, Upgrade: h2c, or joined late).

    ``request_direction`` is the detector's view of who sends requests; the
    session confirms or corrects it from the bytes. A connection whose first
    bytes are an HTTP/1.1 request line is an ``Upgrade: h2c`` one.
    """

    protocol = PROTOCOL

    def __init__(
        self,
        request_direction: Direction,
        progress: bool = False,
        max_open: int = 1024,
        progress_filter: ProgressFilter | None = None,
    ) -> None:
        self.progress = progress
        self.progress_filter = progress_filter
        self.max_open = max_open
        self.client_direction: Direction | None = None
        self._sides = {Direction.INGRESS: _Side(), Direction.EGRESS: _Side()}
        self._streams: dict[int, Http2Exchange] = {}
        #: Client stream ids whose request HEADERS were lost with uncaptured bytes -> when.
        self._lost_streams: dict[int, int] = {}
        #: Streams at or below this were seen (or judged) before the last loss.
        self._lost_floor = 0
        self._highest_stream = 0
        self._errors = 0
        self.joined_late = True
        #: A header block was decoded: from then on a preface cannot vouch for the tables.
        self._blocks_seen = False
        #: Bytes cut from the capture that lost a frame boundary (resynchronised after).
        self.desyncs = 0
        self._upgrade: _Upgrade | None = None
        self._fed = False
        self._fallback = None  # Http1Session when an h2c upgrade was declined

    @property
    def parse_errors(self) -> int:
        errors = self._errors
        if self._fallback is not None:
            errors += self._fallback.parse_errors
        return errors

    # -- Session interface ---------------------------------------------------

    def feed(self, direction: Direction, data: bytes, ts_ns: int, missing: int = 0) -> list[SessionEvent]:
        out: list[SessionEvent] = []
        if self._fallback is not None:
            return self._fallback.feed(direction, data, ts_ns, missing)
        if not self._fed:
            self._fed = True
            if REQUEST_LINE.match(data):
                self._upgrade = _Upgrade(direction)
        if self._upgrade is not None:
            return self._feed_upgrade(direction, data, ts_ns, missing, out)
        if self._errors >= MAX_PARSE_ERRORS:
            return out
        self._feed_frames(direction, data, ts_ns, missing, out)
        return out

    def close(self, ts_ns: int) -> list[SessionEvent]:
        if self._fallback is not None:
            return self._fallback.close(ts_ns)
        out: list[SessionEvent] = []
        for exchange in list(self._streams.values()):
            out.append(abandon(exchange, Outcome.CONNECTION_CLOSED, ts_ns))
        self._streams.clear()
        return out

    # -- framing ----------------------------------------------------------------

    def _feed_frames(self, direction: Direction, data: bytes, ts_ns: int, missing: int, out: list) -> None:
        side = self._sides[direction]
        if side.desynced:
            if not data or not frames_plausible(bytes(data[:512]))[0]:
                return  # still lost: wait for a write that starts with a frame
            side.desynced = False
        side.buf += data
        if not side.started:
            if not self._first_bytes(direction, side):
                return
        self._drain(direction, side, ts_ns, out)
        if missing:
            self._skip_missing(direction, side, missing, ts_ns, out)

    def _first_bytes(self, direction: Direction, side: _Side) -> bool:
        """The start of a direction: strip the client preface if it is there."""
        buf = side.buf
        if len(buf) < len(PREFACE) and PREFACE.startswith(bytes(buf)):
            return False  # wait for the rest of the preface
        side.started = True
        if buf.startswith(PREFACE):
            del buf[: len(PREFACE)]
            self.client_direction = direction
            # Seen from the start (the server's SETTINGS may come first): tables are complete.
            if not self._blocks_seen:
                self.joined_late = False
                for each in self._sides.values():
                    each.decoder.complete = True
        return True

    def _drain(self, direction: Direction, side: _Side, ts_ns: int, out: list) -> None:
        buf = side.buf
        while True:
            if side.data_left:
                take = min(side.data_left, len(buf))
                if take:
                    chunk = bytes(buf[:take])
                    del buf[:take]
                    side.data_left -= take
                    self._on_data(direction, side.data_stream, take, chunk, ts_ns, out)
                if side.data_left:
                    return
                self._data_frame_done(direction, side, ts_ns, out)
            if len(buf) < HEADER_LEN:
                return
            length, frame_type, flags, stream_id = read_header(buf)
            if frame_type == DATA:
                del buf[:HEADER_LEN]
                side.data_left, side.data_stream, side.data_flags = length, stream_id, flags
                if flags & FLAG_PADDED:
                    self._mark_padded(direction, stream_id)
                if length == 0:
                    self._data_frame_done(direction, side, ts_ns, out)
                continue
            if length > MAX_CONTROL_FRAME:
                # Too big to buffer: skip its payload like DATA's; a lost header block untrusts HPACK.
                del buf[:HEADER_LEN]
                side.data_left, side.data_stream, side.data_flags = length, 0, 0
                if frame_type in (HEADERS, CONTINUATION, PUSH_PROMISE):
                    side.decoder.forget()
                    self._errors += 1
                continue
            if len(buf) < HEADER_LEN + length:
                return
            end = HEADER_LEN + length
            if (frame_type == HEADERS or frame_type == CONTINUATION) and stream_id and not flags & _PAD_OR_PRIORITY:
                fragment = buf[HEADER_LEN : end]  # the payload is the fragment: one copy, no frame object
                del buf[:end]
                self._header_fragment(direction, side, frame_type, flags, stream_id, fragment, ts_ns, out)
                continue
            well_formed = check_unread(buf, length, frame_type, flags, stream_id)
            if well_formed is not None:  # nothing in it for a span: skipped, no frame object built
                del buf[:end]
                if not well_formed:
                    self._errors += 1
                continue
            raw = bytes(buf[:end])
            del buf[:end]
            self._control_frame(direction, side, raw, ts_ns, out)

    def _skip_missing(self, direction: Direction, side: _Side, missing: int, ts_ns: int, out: list) -> None:
        """Bytes not captured: inside a DATA payload they are counted; past it the framing is lost."""
        if side.data_left and not side.buf:
            take = min(side.data_left, missing)
            side.data_left -= take
            missing -= take
            self._on_data(direction, side.data_stream, take, None, ts_ns, out)
            if not side.data_left:
                self._data_frame_done(direction, side, ts_ns, out)
        if missing:
            side.buf.clear()
            side.data_left = 0
            side.block = None
            side.desynced = True
            side.decoder.forget()
            if not side.lost_ns:
                side.lost_ns = ts_ns
                self._lost_floor = self._highest_stream
            self.desyncs += 1

    def _control_frame(self, direction: Direction, side: _Side, raw: bytes, ts_ns: int, out: list) -> None:
        view = memoryview(raw)
        try:
            frame, length = Frame.parse_frame_header(view[:HEADER_LEN])
            frame.parse_body(view[HEADER_LEN : HEADER_LEN + length])
        except (HyperframeError, ValueError, IndexError, KeyError):
            self._errors += 1
            if raw[3] in (HEADERS, CONTINUATION, PUSH_PROMISE):
                side.decoder.forget()
            return
        frame_type = raw[3]
        if frame_type == HEADERS or frame_type == CONTINUATION:
            self._header_fragment(direction, side, frame_type, raw[4], frame.stream_id, bytearray(frame.data), ts_ns, out)
        elif frame_type == PUSH_PROMISE:
            side.block = [frame.stream_id, raw[4], bytearray(frame.data), True]
            if raw[4] & FLAG_END_HEADERS:
                self._block_done(direction, side, ts_ns, out)
        elif frame_type == RST_STREAM:
            self._on_reset(frame.stream_id, frame.error_code, ts_ns, out)
        elif frame_type == GOAWAY:
            self._on_goaway(direction, frame.last_stream_id, frame.error_code, ts_ns, out)
        elif frame_type == SETTINGS and not raw[4] & FLAG_ACK:
            table_size = frame.settings.get(SettingsFrame.HEADER_TABLE_SIZE)
            if table_size is not None:
                # The sender decodes what comes the other way: that encoder's bound.
                other = self._sides[direction.opposite].decoder
                if not other.complete:
                    other.set_max_size(table_size)

    def _header_fragment(
        self, direction: Direction, side: _Side, frame_type: int, flags: int, stream_id: int, fragment: bytearray,
        ts_ns: int, out: list,
    ) -> None:
        """A HEADERS or CONTINUATION frame's piece of a header block, a copy the block may keep
        (padding and priority already stripped: by hyperframe, or absent, the common case, where
        ``_drain`` takes the payload as it is without building a frame object)."""
        if frame_type == HEADERS:
            side.block = [stream_id, flags, fragment, False]
        else:
            block = side.block
            if block is None or block[0] != stream_id:
                self._errors += 1
                side.decoder.forget()
                return
            if len(block[2]) + len(fragment) > MAX_HEADER_BLOCK:
                side.block = None
                side.decoder.forget()
                self._errors += 1
                return
            block[2] += fragment
        if flags & FLAG_END_HEADERS:
            self._block_done(direction, side, ts_ns, out)

    # -- streams -------------------------------------------------------------------

    def _block_done(self, direction: Direction, side: _Side, ts_ns: int, out: list) -> None:
        stream_id, flags, block, is_push = side.block
        side.block = None
        self._blocks_seen = True
        decoded = side.decoder.decode(bytes(block))
        if decoded.malformed:
            self._errors += 1
            side.decoder.forget()  # insertions after the failure were lost
        if is_push:
            return  # server push is decoded (the table needs it) but not traced
        names = {name for name, _ in decoded.headers}
        if self.client_direction is None:
            if names & _REQUEST_PSEUDO:
                self.client_direction = direction
            elif ":status" in names:
                self.client_direction = direction.opposite
            else:
                return  # cannot tell yet whose block this is
        end_stream = bool(flags & FLAG_END_STREAM)
        if direction == self.client_direction:
            self._request_block(stream_id, decoded, names, end_stream, ts_ns, out)
        else:
            self._response_block(stream_id, decoded, names, end_stream, ts_ns, out)

    def _request_block(self, stream_id, decoded, names, end_stream: bool, ts_ns: int, out: list) -> None:
        exchange = self._streams.get(stream_id)
        if exchange is not None:  # request trailers
            message = exchange.request
            message.trailers.extend(decoded.headers)
            message.unknown_fields += decoded.unknown
            message.end_ns = ts_ns
            message.ended = message.ended or end_stream
            return
        new_request = bool(names & _REQUEST_PSEUDO) or (decoded.unknown and not end_stream)
        if stream_id <= self._highest_stream or not new_request:
            return  # a stream opened before the agent joined, or one already ended
        self._note_lost_streams(stream_id)
        self._highest_stream = stream_id
        request = Http2Message(
            headers=decoded.headers,
            unknown_fields=decoded.unknown,
            start_ns=ts_ns,
            end_ns=ts_ns,
            ended=end_stream,
        )
        self._open(Http2Exchange(stream_id, request, joined_late=self.joined_late), ts_ns, out)

    def _open(self, exchange: Http2Exchange, ts_ns: int, out: list) -> None:
        exchange.kind = ExchangeKind.for_request(self.client_direction)
        if self.progress:
            wanted = self.progress_filter
            exchange.reports_progress = wanted is None or wanted(exchange)
        self._streams[exchange.stream_id] = exchange
        out.append(ExchangeStarted(exchange))
        if len(self._streams) > self.max_open:
            oldest = next(iter(self._streams))
            out.append(abandon(self._streams.pop(oldest), Outcome.EVICTED, ts_ns))

    def _note_lost_streams(self, stream_id: int) -> None:
        """Bytes of the client's side were lost since the last request: the stream ids
        skipped up to ``stream_id`` may have been opened in them (clients count up by 2)."""
        client_side = self._sides[self.client_direction]
        if not client_side.lost_ns:
            return
        first = self._highest_stream + 2 if self._highest_stream else 1
        for skipped in range(max(first, stream_id - 128), stream_id, 2):
            self._lost_streams[skipped] = client_side.lost_ns
        client_side.lost_ns = 0
        self._lost_floor = stream_id
        while len(self._lost_streams) > 64:
            self._lost_streams.pop(next(iter(self._lost_streams)))

    def _lost_request(self, stream_id: int, ts_ns: int, out: list) -> Http2Exchange | None:
        """A response on a stream whose request was in uncaptured bytes: trace it anyway,
        its request's fields unknown (one unknown field marks it)."""
        lost_ns = self._lost_streams.pop(stream_id, 0)
        client_side = self._sides[self.client_direction]
        if not lost_ns and client_side.lost_ns and stream_id & 1 and stream_id > self._lost_floor:
            # A client stream not seen since the loss: opened in the lost bytes (the loss
            # stays open until a request is read again: one write may hold many HEADERS,
            # answered in any order). A stream's first response block is its only start.
            lost_ns = client_side.lost_ns
            self._highest_stream = max(self._highest_stream, stream_id)
        if not lost_ns:
            return None
        request = Http2Message(unknown_fields=1, start_ns=lost_ns, end_ns=lost_ns)
        exchange = Http2Exchange(stream_id, request, joined_late=self.joined_late)
        self._open(exchange, ts_ns, out)
        return exchange

    def _response_block(self, stream_id, decoded, names, end_stream: bool, ts_ns: int, out: list) -> None:
        exchange = self._streams.get(stream_id)
        if exchange is None:
            exchange = self._lost_request(stream_id, ts_ns, out)
            if exchange is None:
                return  # its request was never seen (opened before the agent), or it ended
        response = exchange.response
        if response is None or not response.headers and not response.unknown_fields:
            status = _status(decoded.headers)
            if status.startswith("1") and not end_stream:
                return  # interim (100 Continue, 103): the final head is still to come
            response = Http2Message(
                headers=decoded.headers, unknown_fields=decoded.unknown, start_ns=ts_ns, end_ns=ts_ns
            )
            exchange.response = response
            if exchange.reports_progress:
                out.append(ExchangeProgress(exchange, Phase.RESPONSE_START, ts_ns))
        else:  # trailers
            response.trailers.extend(decoded.headers)
            response.unknown_fields += decoded.unknown
            response.end_ns = ts_ns
        if end_stream:
            self._complete(exchange, ts_ns, out)

    def _complete(self, exchange: Http2Exchange, ts_ns: int, out: list) -> None:
        exchange.response.ended = True
        exchange.response.end_ns = ts_ns
        self._streams.pop(exchange.stream_id, None)
        out.append(ExchangeCompleted(exchange))

    def _message(self, direction: Direction, stream_id: int) -> tuple[Http2Exchange | None, Http2Message | None]:
        exchange = self._streams.get(stream_id)
        if exchange is None:
            return None, None
        return exchange, exchange.request if direction == self.client_direction else exchange.response

    def _on_data(self, direction: Direction, stream_id: int, size: int, chunk: bytes | None, ts_ns: int, out) -> None:
        exchange, message = self._message(direction, stream_id)
        if message is None:
            return
        message.body_size += size
        message.end_ns = ts_ns
        if chunk is None:
            message.body_truncated = True
        _count_grpc(message, size, chunk)
        if exchange.reports_progress and (chunk or chunk is None):  # None: a hole, as HTTP/1 reports it
            phase = Phase.REQUEST_BODY if message is exchange.request else Phase.RESPONSE_BODY
            out.append(ExchangeProgress(exchange, phase, ts_ns, chunk))

    def _data_frame_done(self, direction: Direction, side: _Side, ts_ns: int, out: list) -> None:
        if not side.data_flags & FLAG_END_STREAM:
            return
        exchange, message = self._message(direction, side.data_stream)
        if message is None:
            return
        if message is exchange.request:
            message.ended = True
            message.end_ns = ts_ns
        else:
            self._complete(exchange, ts_ns, out)

    def _mark_padded(self, direction: Direction, stream_id: int) -> None:
        """Padding sits inside the payload: gRPC message counting cannot follow it."""
        _, message = self._message(direction, stream_id)
        if message is not None:
            message.grpc_messages = None

    def _on_reset(self, stream_id: int, code: int, ts_ns: int, out: list) -> None:
        exchange = self._streams.pop(stream_id, None)
        if exchange is not None:
            exchange.reset_code = code
            out.append(abandon(exchange, Outcome.CANCELLED, ts_ns))

    def _on_goaway(self, direction: Direction, last_stream_id: int, code: int, ts_ns: int, out: list) -> None:
        """A server's GOAWAY: client streams above ``last_stream_id`` were never processed."""
        if direction == self.client_direction:
            return  # about server-initiated (push) streams: none are traced
        for stream_id in [s for s in self._streams if s > last_stream_id]:
            exchange = self._streams.pop(stream_id)
            exchange.reset_code = code
            out.append(abandon(exchange, Outcome.CANCELLED, ts_ns))

    # -- Upgrade: h2c ------------------------------------------------------------

    def _feed_upgrade(self, direction: Direction, data: bytes, ts_ns: int, missing: int, out: list) -> list:
        upgrade = self._upgrade
        upgrade.record(direction, data, ts_ns, missing)
        if upgrade.size > MAX_UPGRADE_BYTES or missing:
            return self._decline(out)  # too long, or bytes lost: HTTP/1's parser copes
        if direction == upgrade.request_direction:
            upgrade.parse_request(ts_ns)
            return out
        verdict = upgrade.parse_response()
        if verdict is None:
            return out
        if not verdict:
            return self._decline(out)
        return self._switch(upgrade, ts_ns, out)

    def _decline(self, out: list) -> list:
        """The server answered in HTTP/1.1: replay everything into an HTTP/1 session."""
        from protocols.http1.stitch import Http1Session

        upgrade, self._upgrade = self._upgrade, None
        self._fallback = Http1Session(
            upgrade.request_direction, body_limit=0, progress=self.progress, progress_filter=self.progress_filter
        )
        for direction, data, ts_ns, missing in upgrade.events:
            out.extend(self._fallback.feed(direction, data, ts_ns, missing))
        return out

    def _switch(self, upgrade: "_Upgrade", ts_ns: int, out: list) -> list:
        """101 Switching Protocols: the upgrade request is stream 1; frames follow."""
        self._upgrade = None
        self.client_direction = upgrade.request_direction
        self.joined_late = False
        for side in self._sides.values():
            side.decoder.complete = True
        request = Http2Message(
            headers=upgrade.request_headers,
            start_ns=upgrade.request_start_ns,
            end_ns=upgrade.request_end_ns,
            ended=True,
        )
        exchange = Http2Exchange(1, request, upgraded=True)
        self._highest_stream = 1
        self._open(exchange, ts_ns, out)
        self._feed_frames(upgrade.request_direction, upgrade.request_rest, upgrade.request_rest_ns, 0, out)
        self._feed_frames(upgrade.request_direction.opposite, upgrade.response_rest, ts_ns, 0, out)
        return out


class _Upgrade:
    """The HTTP/1.1 exchange that asks for ``h2c``, until the server answers."""

    def __init__(self, request_direction: Direction) -> None:
        self.request_direction = request_direction
        self.events: list[tuple[Direction, bytes, int, int]] = []
        self.size = 0
        self.request_buf = bytearray()
        self.response_buf = bytearray()
        self.request_headers: list[tuple[str, str]] = []
        self.request_start_ns = 0
        self.request_end_ns = 0
        self.request_done = False
        self.request_rest = b""
        self.request_rest_ns = 0
        self.response_rest = b""

    def record(self, direction: Direction, data: bytes, ts_ns: int, missing: int) -> None:
        self.events.append((direction, data, ts_ns, missing))
        self.size += len(data)
        (self.request_buf if direction == self.request_direction else self.response_buf).extend(data)

    def parse_request(self, ts_ns: int) -> None:
        """The upgrade request's head (and Content-Length body): HTTP/2 pseudo-headers from it."""
        if not self.request_start_ns:
            self.request_start_ns = ts_ns
        if self.request_done:
            self.request_rest = bytes(self.request_buf)
            self.request_rest_ns = ts_ns
            return
        head_end = self.request_buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        lines = bytes(self.request_buf[:head_end]).decode("latin-1").split("\r\n")
        method, _, rest = lines[0].partition(" ")
        target = rest.rpartition(" ")[0]
        headers = [(":method", method), (":path", target), (":scheme", "http")]
        body_len = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip()
            if name == "host":
                headers.append((":authority", value))
            elif name == "content-length" and value.isdigit():
                body_len = int(value)
            if name not in ("host", "connection", "upgrade", "http2-settings"):
                headers.append((name, value))
        end = head_end + 4 + body_len
        if len(self.request_buf) < end:
            return
        self.request_headers = headers
        self.request_done = True
        self.request_end_ns = ts_ns
        self.request_rest = bytes(self.request_buf[end:])
        self.request_rest_ns = ts_ns
        del self.request_buf[:end]

    def parse_response(self) -> bool | None:
        """True on ``101`` (HTTP/2 follows), False on any other status, None until known."""
        head_end = self.response_buf.find(b"\r\n\r\n")
        if head_end < 0:
            if len(self.response_buf) >= 12 and not self.response_buf.startswith(b"HTTP/1.1 101"):
                return False
            return None
        if not self.response_buf.startswith(b"HTTP/1.1 101") or not self.request_done:
            return False
        self.response_rest = bytes(self.response_buf[head_end + 4 :])
        return True


def _status(headers: list) -> str:
    """The ``:status`` of a response head ("" when absent); a loop, not a generator
    (a generator object per response block)."""
    for name, value in headers:
        if name == ":status":
            return value
    return ""


def _count_grpc(message: Http2Message, size: int, chunk: bytes | None) -> None:
    """Count gRPC length-prefixed messages (1-byte flag, 4-byte length, body) in DATA bytes."""
    if message.grpc_messages is None:
        return
    pos = 0
    while pos < size:
        if message.grpc_left:
            take = min(message.grpc_left, size - pos)
            message.grpc_left -= take
            pos += take
            continue
        if chunk is None:
            message.grpc_messages = None  # a prefix was not captured: the count is lost
            return
        if not message.grpc_prefix and pos + 5 <= len(chunk):
            # the whole prefix in this chunk, as nearly always: read in place, no concatenation
            flag, length = chunk[pos], read_u32(chunk, pos + 1)
            pos += 5
        else:
            need = 5 - len(message.grpc_prefix)
            piece = chunk[pos : pos + need]
            message.grpc_prefix += piece
            pos += len(piece)
            if len(message.grpc_prefix) < 5:
                continue
            prefix = message.grpc_prefix
            flag, length = prefix[0], read_u32(prefix, 1)
            message.grpc_prefix = b""
        if flag > 1:  # the compressed flag is 0 or 1: not gRPC framing
            message.grpc_messages = None
            return
        message.grpc_messages += 1
        message.grpc_left = length
