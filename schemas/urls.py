"""Telling remote URLs (gs://, s3://, any fsspec protocol) from local paths."""


def is_remote(path: str) -> bool:
    """True for URLs such as gs://bucket/path; False for local paths and file:// URLs."""
    return "://" in path and not path.startswith("file://")
