"""gcp-storage-emulator as the tests run it: a longer listen queue, and GCS's objects.move (moveTo), which it lacks.

Usage: python gcs_emulator.py start --host=127.0.0.1 --port=PORT [emulator flags...]

Without moveTo the emulator answers 501, which gcsfs retries with back-off for about 33 s before
it falls back to copy and delete: every fs.mv into the bucket (the inventory cache, a build's
last renames) cost half a minute, only under the emulator. Real GCS has the call.
"""

from __future__ import annotations

import re
import socketserver
import sys
from http import HTTPStatus

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

if __name__ == "__main__":
    # Planning and workers fetch byte ranges concurrently; the emulator's one-threaded server
    # would drop connections beyond its default listen queue of 5 and stall each on a TCP retry.
    socketserver.TCPServer.request_queue_size = 128
    server.HANDLERS = (MOVE, *server.HANDLERS)  # before the generic object route, which would answer 501
    from gcp_storage_emulator.__main__ import main

    main(sys.argv[1:])
