"""Pretrained MatRIS models: a registry of published checkpoints, a verified download cache,
and :func:`resolve`, which turns a name, URL or path into a local checkpoint file.

``MatRIS.load("matris-10m-oam")`` downloads the model once into :func:`cache_dir` and checks it
on every later load. Environment variables: ``MATRIS_CACHE`` (cache folder),
``MATRIS_OFFLINE=1`` (never download). Timeouts and retries are arguments:
``MatRIS.load(name, download=DownloadSettings(timeout=120, retries=10))`` (seconds per
connect/read, default 30; attempts after the first, default 5; ``backoff`` seconds before the
first retry, doubled each time, default 1), ``matris download NAME --timeout 120 --retries 10``.
A server that cannot be reached at all
(no network: the host name does not resolve, the connection is refused) is not retried: the
load fails at once with one message saying where to put a file fetched elsewhere.
"""

from __future__ import annotations

from .cache import (
    available_offline,
    cache_dir,
    cached_models,
    cached_path,
    download,
    entry_for_file,
    fetch,
    fetch_url,
    is_offline,
    list_models,
    locate,
    model_info,
    read_records,
    resolve,
    sha256_file,
    url_cache_path,
    verify_checkpoint,
)
from .registry import REGISTRY, ModelEntry, Registry, get_entry, normalize_name, register, unregister
from .transfer import DownloadSettings, UnreachableError, check_url, fetch_to_part, file_lock, part_path

__all__ = [
    "ModelEntry", "Registry", "REGISTRY", "register", "unregister", "get_entry", "normalize_name",
    "resolve", "locate", "download", "fetch", "fetch_url", "cache_dir", "is_offline", "cached_path", "url_cache_path",
    "cached_models", "list_models", "model_info", "available_offline", "read_records", "sha256_file",
    "verify_checkpoint", "entry_for_file", "DownloadSettings", "UnreachableError", "check_url", "fetch_to_part",
    "file_lock", "part_path",
]
