"""gcp-storage-emulator as the tests run it: a longer listen queue, GCS's objects.move (moveTo), which it lacks,
multipart uploads taken byte for byte, and, when asked, a log of every request it answers.

Usage: python gcs_emulator.py start --host=127.0.0.1 --port=PORT [emulator flags...]

With ``XTF_EMULATOR_REQUEST_LOG=PATH`` in its environment each request answered is appended to PATH as
one JSON line: method, path, query, the object's name where one is known, the bytes received and
sent, the status (benchmarks.cost counts GCS's billed operations from it).

The emulator parses a multipart upload with Python's email parser, which reads the body as lines: gcsfs ends
its data with b"\n--boundary", so an object whose last byte is b"\r" lost it (the parser took b"\r\n" for the
line break before the boundary): one upload in 256 of random bytes, e.g. a TFRecord ending in its CRC. Real
GCS takes the bytes exactly; so does this parser.

Without moveTo the emulator answers 501, which gcsfs retries with back-off for about 33 s before
it falls back to copy and delete: every fs.mv into the bucket (the inventory cache, a build's
last renames) cost half a minute, only under the emulator. Real GCS has the call.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socketserver
import sys
from http import HTTPStatus
from urllib.parse import parse_qs, unquote, urlparse

from gcp_storage_emulator import server, settings
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects


def move(request, response, storage, *args, **kwargs):
    """objects.move: the object under its new name in the same bucket, then the old name deleted."""
    bucket, source, destination = (request.params[k] for k in ("bucket_name", "object_id", "dest_object_id"))
    try:
        moved = objects._copy(request.base_url, storage, bucket, source, bucket, destination)
        storage.delete_file(bucket, source)
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    response.json(moved)


MOVE = (
    rf"^{re.escape(settings.API_ENDPOINT)}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)"
    rf"/moveTo/o/(?P<dest_object_id>.*[^/]+)$",
    {server.POST: move},
)


def exact_multipart(read_data):
    """The emulator's body reader, with a multipart/related upload split at its delimiters exactly."""

    def reading(request_handler, query):
        content_type = request_handler.headers.get("Content-Type") or ""
        if not content_type.startswith("multipart/related"):
            return read_data(request_handler, query)
        raw = server._decode_raw_data(server._read_raw_data(request_handler), request_handler)
        boundary = re.search(r'boundary="?([^";]+)"?', content_type)[1].encode()
        return related_parts(raw, boundary)

    return reading


def related_parts(raw: bytes, boundary: bytes) -> dict:
    """A multipart upload's metadata (JSON), data and data's content type, as the emulator's handlers take them.

    The delimiter is the line break the body's first line ends with (CRLF, as RFC 2046 has it, or LF, as
    gcsfs sends it), then ``--boundary``: the data is every byte between its part's headers and the last one.
    """
    opening = b"--" + boundary
    if not raw.startswith(opening):
        raise ValueError("a multipart upload that does not start with its boundary")
    newline = b"\r\n" if raw[len(opening) : len(opening) + 2] == b"\r\n" else b"\n"
    delimiter = newline + opening
    first, rest = raw[len(opening) :].split(delimiter, 1)
    second = rest.rsplit(delimiter + b"--", 1)[0]
    (_, meta), (data_headers, data) = (_part(part, newline) for part in (first, second))
    if data_headers.get("content-transfer-encoding", "").lower() == "base64":
        data = base64.b64decode(data)
    content_type = data_headers.get("content-type", "text/plain").split(";")[0].strip().lower()
    return {"meta": json.loads(meta), "content": data, "content-type": content_type}


def _part(part: bytes, newline: bytes) -> tuple[dict[str, str], bytes]:
    """A part's headers (lower-case names) and body; the part starts with the line break after its delimiter."""
    part = part[len(newline) :]
    head, body = (b"", part[len(newline) :]) if part.startswith(newline) else part.split(newline + newline, 1)
    headers = {}
    for line in filter(None, head.split(newline)):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers, body


#: An object's name in an upload's metadata (a resumable upload's start, a multipart upload's first part).
_NAME_IN_BODY = re.compile(rb'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_OBJECT_IN_PATH = re.compile(r"/b/[-.\w]+/o/(?P<object_id>.*[^/])$")
#: A batch's nested requests (GCS bills each of them): their method and path, a line each.
_NESTED = re.compile(rb"^(GET|POST|PUT|PATCH|DELETE) (\S+)", re.MULTILINE)


class RequestLog:
    """Appends one JSON line per request answered; a resumable upload's later requests carry its start's name."""

    def __init__(self, path: str):
        # Open for the server's life, a line at a time: a reader sees every finished request.
        self._file = open(path, "a", buffering=1)  # noqa: SIM115
        self._uploads: dict[str, str] = {}

    def install(self) -> None:
        """Hook the emulator's router, body reader and response: each request's figures, then its line."""
        handle, read_raw, close = server.Router.handle, server._read_raw_data, server.Response.close

        def reading(request_handler):
            data = read_raw(request_handler)
            data = data or b""
            nested = (
                [[m.decode(), u.decode()] for m, u in _NESTED.findall(data)]
                if "/batch/" in request_handler.path
                else []
            )
            request_handler.xtf_body = (len(data), bytes(data[:4096]), nested)
            return data

        def closing(response):
            content = response._content.encode() if isinstance(response._content, str) else response._content or b""
            location = response._headers.get("Location", "").encode()  # (a resumable upload's id)
            response._handler.xtf_sent = (response.status.value, len(content), content[:4096] + location)
            close(response)

        def handling(router, method):
            handler = router._request_handler
            handler.xtf_body, handler.xtf_sent = (
                (0, b"", []),
                (0, 0, b""),
            )  # (one handler serves a connection's requests)
            handle(router, method)
            self.write(method, handler.path, *handler.xtf_body, *handler.xtf_sent)

        server.Router.handle, server._read_raw_data, server.Response.close = handling, reading, closing

    def write(self, method, url, received, body_head, nested, status, sent, content) -> None:
        parsed = urlparse(url)
        query = {k: v[0] for k, v in parse_qs(parsed.query).items()}
        match = _OBJECT_IN_PATH.search(parsed.path)
        name = unquote(match["object_id"]) if match else query.get("name")
        if name is None:
            found = _NAME_IN_BODY.search(body_head) or _NAME_IN_BODY.search(content)
            name = found[1].decode() if found else None
        upload = query.get("upload_id")
        if upload is not None:
            name = name or self._uploads.get(upload)
        if name is not None and query.get("uploadType") == "resumable" and status == 200:
            started = re.search(rb"upload_id=([^&\"]+)", content)
            if started:
                self._uploads[started[1].decode()] = name
        row = {"method": method, "path": parsed.path, "query": query, "name": name, "nested": nested}
        self._file.write(json.dumps({**row, "received": received, "sent": sent, "status": status}) + "\n")


if __name__ == "__main__":
    # Planning and workers fetch byte ranges concurrently; the emulator's one-threaded server
    # would drop connections beyond its default listen queue of 5 and stall each on a TCP retry.
    socketserver.TCPServer.request_queue_size = 128
    server.HANDLERS = (MOVE, *server.HANDLERS)  # before the generic object route, which would answer 501
    server._read_data = exact_multipart(server._read_data)
    if "--in-memory" in sys.argv:
        from gcp_storage_emulator.storage import Storage

        # Each upload or deletion would serialise the whole store's metadata to JSON, which only a store on disk
        # reads back: 10,000 uploads took over 15 minutes.
        Storage._write_config_to_file = lambda self: None
    if os.environ.get("XTF_EMULATOR_REQUEST_LOG"):
        RequestLog(os.environ["XTF_EMULATOR_REQUEST_LOG"]).install()
    from gcp_storage_emulator.__main__ import main

    main(sys.argv[1:])
