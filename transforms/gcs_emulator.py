"""Lets Beam's GCS filesystem talk to a storage emulator (STORAGE_EMULATOR_HOST) without credentials.

google-cloud-storage already uses anonymous credentials when STORAGE_EMULATOR_HOST is set, but
Beam first looks for Google credentials itself and retries for about 25 s per process before
giving up. With an emulator there is nothing to find, so we tell Beam so up front. Without the
variable this module does nothing.
"""

from __future__ import annotations

import os


def use_anonymous_credentials_for_emulator() -> bool:
    """Mark Beam's credential lookup as done (no credentials) when an emulator is configured."""
    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        return False
    from apache_beam.internal.gcp import auth

    cache = getattr(auth, "_Credentials", None)
    if cache is None or not hasattr(cache, "_credentials_init"):
        return False  # a Beam version that looks credentials up differently: nothing to skip
    with cache._credentials_lock:
        cache._credentials = None
        cache._credentials_init = True
    return True
