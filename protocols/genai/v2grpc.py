"""The v2 inference protocol over gRPC (Triton, KServe): ``inference.GRPCInferenceService``'s
``ModelInfer`` (unary) and ``ModelStreamInfer`` (bidirectional streaming), read from the
gRPC messages that cross the socket in the stream's DATA.

Pure and sans-IO like the rest of :mod:`protocols.genai`: no protobuf runtime, no
generated stubs; a small bounded reader of the protobuf wire format, enough for the
fields a span needs (grpc_service.proto of the KServe / Triton protocol)::

    ModelInferRequest        1 model_name  2 model_version  3 id  5 inputs (repeated)  6 outputs
    ModelInferResponse       1 model_name  2 model_version  3 id  5 outputs (repeated)
    ModelStreamInferResponse 1 error_message  2 infer_response (a ModelInferResponse)

What is kept is bounded whatever the tensors: the first :data:`MESSAGE_HEAD_LIMIT` bytes
of the message being read (protobuf writes fields in number order, so the names, ids
and tensor descriptions come before ``raw_input_contents`` / ``raw_output_contents``,
the tensor bytes, which are never kept), decoded when the message ends and dropped; a
head cut by the limit (or by bytes the capture lost) is read as far as it goes. A
compressed message (the gRPC flag, ``grpc-encoding`` gzip or deflate) is inflated up to
the same limit.

:class:`V2GrpcCall` has :class:`~protocols.genai.llm.LlmCall`'s feeding interface (fed the
request's and the response's DATA bytes, ``finish`` -> :class:`LlmFacts`):

* the first request's ``model_name`` -> ``request_model``, its ``model_version``
  (else the first response's) -> ``model_version``, its input tensors -> ``inputs``;
* the first response's ``model_name`` -> ``response_model``, ``id`` -> ``response_id``,
  its output tensors -> ``outputs``;
* ``ModelStreamInfer``: ``stream`` and ``streamed``; each response that returns at least
  one output tensor is an output chunk (its time: the syscall's that completed it), so
  the first is the time to first chunk; a response that is an ``error_message``, or a
  decoupled model's empty final response, is not.

Nothing here raises: bytes that are not the protocol's messages are counted in
``parse_errors`` (a message that does not decode, a gRPC prefix whose flag is neither 0
nor 1, a compressed message that does not inflate) and give fewer facts; a hole in the
bytes (``None``) ends the reading of that direction, since the gRPC framing is lost
(the message in progress is read from its head first; ``gaps`` counts response holes).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from protocols.genai.facts import Endpoint, LlmFacts

#: Bytes kept of the start of the gRPC message being read.
MESSAGE_HEAD_LIMIT = 64 * 1024
#: Characters kept of a string field (a model name, version or id).
STRING_LIMIT = 1024
#: Tensor fields: ``inputs`` of a request, ``outputs`` of a response (both number 5).
_TENSORS = 5
#: ModelStreamInferResponse fields.
_ERROR_MESSAGE, _INFER_RESPONSE = 1, 2
#: zlib's window bits that accept a zlib (gRPC ``deflate``) or a gzip header.
_ZLIB_OR_GZIP = 32 + 15

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class ProtobufError(ValueError):
    """The bytes are not a protobuf message of the expected shape."""


class _Truncated(ProtobufError):
    """The bytes end inside a field."""


def read_varint(data: bytes | bytearray, pos: int, end: int) -> tuple[int, int]:
    """The base-128 varint at ``data[pos:end]`` and the position after it."""
    result = shift = 0
    while True:
        if pos >= end:
            raise _Truncated("varint cut")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ProtobufError("varint longer than 10 bytes")


def iter_fields(data: bytes | bytearray, start: int, end: int, cut: bool):
    """The fields of the message in ``data[start:end]``: (number, wire type, value), where
    the value of a length-delimited field is its (start, stop) in ``data`` and that of a
    number field the number. ``cut``: the message goes on past ``end`` (only its head is
    here): a field that runs past ``end`` ends the iteration, a length-delimited one after
    yielding what is here of it (stop = ``end``, wire type ``-2``); otherwise it is a
    :class:`ProtobufError`, as any malformed field is."""
    pos = start
    while pos < end:
        try:
            key, pos = read_varint(data, pos, end)
            number, wire = key >> 3, key & 7
            if number == 0:
                raise ProtobufError("field number 0")
            if wire == _LEN:
                length, pos = read_varint(data, pos, end)
                stop = pos + length
                if stop > end:
                    if not cut:
                        raise _Truncated("length-delimited field cut")
                    yield number, -_LEN, (pos, end)
                    return
                yield number, _LEN, (pos, stop)
                pos = stop
            elif wire == _VARINT:
                value, pos = read_varint(data, pos, end)
                yield number, _VARINT, value
            elif wire == _I64 or wire == _I32:
                size = 8 if wire == _I64 else 4
                if pos + size > end:
                    raise _Truncated("fixed-size field cut")
                yield number, wire, int.from_bytes(data[pos : pos + size], "little")
                pos += size
            else:  # groups (3, 4: proto2 only) and the invalid 6, 7
                raise ProtobufError(f"wire type {wire}")
        except _Truncated:
            if cut:
                return
            raise


def _string(data: bytes | bytearray, span: tuple[int, int]) -> str:
    start, stop = span
    try:
        text = bytes(data[start : min(stop, start + 4 * STRING_LIMIT)]).decode("utf-8")
    except UnicodeDecodeError as exc:
        if stop - start <= 4 * STRING_LIMIT:
            raise ProtobufError("a string field that is not UTF-8") from exc
        text = bytes(data[start : start + 4 * STRING_LIMIT]).decode("utf-8", "ignore")  # cut mid-character
    return text[:STRING_LIMIT]


@dataclass(slots=True)
class InferHead:
    """The fields read of a ModelInferRequest or ModelInferResponse ("" : absent)."""

    model_name: str = ""
    model_version: str = ""
    id: str = ""
    #: Input tensors (a request) or output tensors (a response) described.
    tensors: int = 0
    #: The message was read whole (not only a head).
    whole: bool = True


def _infer_message(data: bytes | bytearray, start: int, end: int, cut: bool) -> InferHead:
    head = InferHead(whole=not cut)
    for number, wire, value in iter_fields(data, start, end, cut):
        if number <= 3:
            if wire != _LEN:
                if wire == -_LEN:
                    continue  # a name cut by the head's end: not kept
                raise ProtobufError(f"field {number} is not a string")
            text = _string(data, value)
            if number == 1:
                head.model_name = text
            elif number == 2:
                head.model_version = text
            else:
                head.id = text
        elif number == _TENSORS:
            if wire != _LEN and wire != -_LEN:
                raise ProtobufError("a tensor field that is not a message")
            head.tensors += 1
    return head


def decode_infer_request(data: bytes | bytearray, cut: bool = False) -> InferHead:
    """A ModelInferRequest (``cut``: ``data`` is only its head); ``tensors`` = inputs."""
    return _infer_message(data, 0, len(data), cut)


def decode_infer_response(data: bytes | bytearray, cut: bool = False) -> InferHead:
    """A ModelInferResponse (``cut``: ``data`` is only its head); ``tensors`` = outputs."""
    return _infer_message(data, 0, len(data), cut)


def decode_stream_response(data: bytes | bytearray, cut: bool = False) -> tuple[str, InferHead | None]:
    """A ModelStreamInferResponse: (its ``error_message``, its ``infer_response`` or None)."""
    error, response = "", None
    for number, wire, value in iter_fields(data, 0, len(data), cut):
        if number == _ERROR_MESSAGE:
            if wire == _LEN:
                error = _string(data, value)
            elif wire != -_LEN:
                raise ProtobufError("error_message is not a string")
        elif number == _INFER_RESPONSE:
            if wire != _LEN and wire != -_LEN:
                raise ProtobufError("infer_response is not a message")
            response = _infer_message(data, value[0], value[1], wire == -_LEN)
    return error, response


class GrpcMessages:
    """gRPC length-prefixed messages (a flag byte, a 4-byte big-endian length, the
    message) of one direction of a stream, from its DATA bytes in any chunks: for each
    message, its first ``limit`` bytes, whether it is compressed, whether it was cut.

    Bounded: at most ``limit`` bytes held (the message in progress). After a hole or a
    flag byte that is not 0 or 1 the framing is lost: the rest is ignored."""

    __slots__ = ("limit", "lost", "malformed", "_prefix", "_left", "_length", "_head", "_compressed", "_reading")

    def __init__(self, limit: int = MESSAGE_HEAD_LIMIT) -> None:
        self.limit = limit
        #: The framing was lost (a hole, or a malformed prefix): later bytes are ignored.
        self.lost = False
        #: Prefixes whose flag byte was neither 0 nor 1.
        self.malformed = 0
        self._prefix = b""
        self._left = 0  # bytes of the message in progress still to come
        self._length = 0  # its length (the prefix's)
        self._head = bytearray()
        self._compressed = False
        self._reading = False

    @property
    def buffered(self) -> int:
        return len(self._prefix) + len(self._head)

    def feed(self, data: bytes) -> list[tuple[bytes, bool, bool]]:
        """The messages that end in ``data``: (head, compressed, cut) each."""
        out: list[tuple[bytes, bool, bool]] = []
        if self.lost:
            return out
        pos, size = 0, len(data)
        while pos < size:
            if self._reading:
                take = min(self._left, size - pos)
                room = self.limit - len(self._head)
                if room > 0:
                    self._head += data[pos : pos + min(take, room)]
                pos += take
                self._left -= take
                if not self._left:
                    out.append(self._take())
                continue
            need = 5 - len(self._prefix)
            self._prefix += data[pos : pos + need]
            pos += need
            if len(self._prefix) < 5:
                break
            prefix = self._prefix
            self._prefix = b""
            if prefix[0] > 1:
                self.lost = True
                self.malformed += 1
                break
            self._compressed = prefix[0] == 1
            self._left = self._length = int.from_bytes(prefix[1:5], "big")
            self._reading = True
            if not self._left:
                out.append(self._take())
        return out

    def _take(self) -> tuple[bytes, bool, bool]:
        """The message in progress (its head, and whether that is all of it); reading ends."""
        head = bytes(self._head)
        self._head = bytearray()
        self._reading = False
        return head, self._compressed, len(head) < self._length

    def gap(self) -> tuple[bytes, bool, bool] | None:
        """Bytes were lost here: the message in progress (its head, cut), if any; the
        framing is lost from now on."""
        message = self._take() if self._reading and not self.lost else None
        self.lost = True
        self._prefix = b""
        return message

    def pending(self) -> tuple[bytes, bool, bool] | None:
        """The message still in progress (its head, cut), if any (the stream ended first)."""
        if not self._reading or self.lost:
            return None
        return bytes(self._head), self._compressed, True


def inflate(payload: bytes, cut: bool, limit: int = MESSAGE_HEAD_LIMIT) -> tuple[bytes, bool]:
    """A compressed gRPC message (gzip, or deflate: zlib's format) inflated up to ``limit``
    bytes: (its bytes, whether they are only its head). Raises ProtobufError if it does not inflate."""
    inflater = zlib.decompressobj(_ZLIB_OR_GZIP)
    try:
        out = inflater.decompress(payload, limit)
    except zlib.error as exc:
        raise ProtobufError(f"not gzip or deflate: {exc}") from exc
    whole = inflater.eof and not inflater.unconsumed_tail
    if not whole and not cut and not inflater.unconsumed_tail:
        raise ProtobufError("compressed message cut")
    return out, not whole


class V2GrpcCall:
    """One ModelInfer or ModelStreamInfer call's state (``LlmCall``'s interface), fed its
    DATA bytes in order; bounded: two message heads at most (one per direction)."""

    __slots__ = ("endpoint", "limit", "errors", "parse_errors", "_requests", "_responses", "_facts",
                 "_request_seen", "_response_seen", "_ended")  # fmt: skip

    def __init__(self, endpoint: Endpoint, capture_content: bool = False, limit: int = MESSAGE_HEAD_LIMIT) -> None:
        self.endpoint = endpoint
        self.limit = limit
        #: Internal failures swallowed (a bug, not bad input).
        self.errors = 0
        #: Messages that are not the protocol's (see the module's doc).
        self.parse_errors = 0
        self._requests = GrpcMessages(limit)
        self._responses = GrpcMessages(limit)
        self._facts = LlmFacts(endpoint)
        if endpoint.streaming:
            self._facts.stream = True
            self._facts.streamed = True
        self._request_seen = False
        self._response_seen = False
        self._ended = False

    @property
    def buffered(self) -> int:
        return self._requests.buffered + self._responses.buffered

    # -- feeding (LlmCall's interface) ------------------------------------------

    def request_body(self, data: bytes | None) -> None:
        try:
            if data is None:
                message = self._requests.gap()
                if message is not None:
                    self._request(*message)
                return
            for message in self._requests.feed(data):
                self._request(*message)
        except Exception:  # noqa: BLE001 - never raise on what a traced program sends
            self.errors += 1

    def response_start(self, content_type: str | None) -> None:
        """The response's headers (nothing in them is read)."""

    def response_body(self, ts_ns: int, data: bytes | None) -> None:
        try:
            if data is None:
                if not self._responses.lost:
                    self._facts.gaps += 1
                message = self._responses.gap()
                if message is not None:
                    self._response(ts_ns, *message)
                return
            for message in self._responses.feed(data):
                self._response(ts_ns, *message)
        except Exception:  # noqa: BLE001
            self.errors += 1

    def header(self, response: bool, name: str, value: str | None) -> None:
        """A header its API asked for: none over gRPC."""

    def finish(self) -> LlmFacts | None:
        """The facts, once the stream is over; None when no message named a model."""
        try:
            if not self._ended:
                self._ended = True
                message = self._requests.pending()
                if message is not None and not self._request_seen:
                    self._request(*message)
                message = self._responses.pending()
                if message is not None and not self._response_seen:
                    self._response(0, *message, chunk=False)
                self.parse_errors += self._requests.malformed + self._responses.malformed
            facts = self._facts
            return facts if facts.request_model is not None or facts.response_model is not None else None
        except Exception:  # noqa: BLE001
            self.errors += 1
            return None

    # -- messages ------------------------------------------------------------------

    def _payload(self, head: bytes, compressed: bool, cut: bool) -> tuple[bytes, bool] | None:
        if not compressed:
            return head, cut
        try:
            return inflate(head, cut, self.limit)
        except ProtobufError:
            self.parse_errors += 1
            return None

    def _request(self, head: bytes, compressed: bool, cut: bool) -> None:
        if self._request_seen:
            return  # a stream's later requests: its first one names the call
        payload = self._payload(head, compressed, cut)
        if payload is None:
            return
        try:
            request = decode_infer_request(*payload)
        except ProtobufError:
            self.parse_errors += 1
            return
        self._request_seen = True
        self._requests.limit = 0  # a stream's later requests are not read: nothing of them kept
        facts = self._facts
        if request.model_name:
            facts.request_model = request.model_name
        if request.model_version:
            facts.model_version = request.model_version
        facts.inputs = request.tensors

    def _response(self, ts_ns: int, head: bytes, compressed: bool, cut: bool, chunk: bool = True) -> None:
        payload = self._payload(head, compressed, cut)
        if payload is None:
            return
        try:
            if self.endpoint.streaming:
                _, response = decode_stream_response(*payload)
            else:
                response = decode_infer_response(*payload)
        except ProtobufError:
            self.parse_errors += 1
            return
        if response is None:
            return  # an error_message: no output
        facts = self._facts
        if not self._response_seen:
            self._response_seen = True
            if response.model_name:
                facts.response_model = response.model_name
            if response.model_version and facts.model_version is None:
                facts.model_version = response.model_version
            if response.id:
                facts.response_id = response.id
            facts.outputs = response.tensors
        if chunk and self.endpoint.streaming and response.tensors:
            if not facts.chunks:
                facts.first_chunk_ns = ts_ns
            facts.last_chunk_ns = ts_ns
            facts.chunks += 1
