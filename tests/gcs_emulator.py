"""gcp-storage-emulator as the tests run it: a longer listen queue, GCS's objects.move (moveTo), which it lacks,
and, when asked, a log of every request it answers.

Usage: python gcs_emulator.py start --host=127.0.0.1 --port=PORT [emulator flags...]

With ``XTF_EMULATOR_REQUEST_LOG=PATH`` in its environment each request answered is appended to PATH as
one JSON line: method, path, query, the object's name where one is known, the bytes received and
sent, the status (benchmarks.cost counts GCS's billed operations from it).

Without moveTo the emulator answers 501, which gcsfs retries with back-off for about 33 s before
it falls back to copy and delete: every fs.mv into the bucket (the inventory cache, a build's
last renames) cost half a minute, only under the emulator. Real GCS has the call.
"""

from __future__ import annotations

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
    if "--in-memory" in sys.argv:
        from gcp_storage_emulator.storage import Storage

        # Each upload or deletion would serialise the whole store's metadata to JSON, which only a store on disk
        # reads back: 10,000 uploads took over 15 minutes.
        Storage._write_config_to_file = lambda self: None
    if os.environ.get("XTF_EMULATOR_REQUEST_LOG"):
        RequestLog(os.environ["XTF_EMULATOR_REQUEST_LOG"]).install()
    from gcp_storage_emulator.__main__ import main

    main(sys.argv[1:])
