"""Whether a run's litgpt data module can get its data here, checked before launch.

litgpt's data modules download on first use: ``Alpaca`` (and AlpacaGPT4, LongForm, FLAN) fetch a JSON file over
HTTPS into ``download_dir``; ``Alpaca2k``, ``LIMA`` and ``Deita`` call Hugging Face ``datasets.load_dataset``. Without
the network (or without the ``datasets`` package) they fail after the model is loaded, with a traceback, and leave
an empty ``data/<name>/`` behind. :func:`problem` says so in one line before anything starts.

Offline is detected by a 3-second TCP connection to the data's host, or declared with ``TUNELAB_OFFLINE=1`` (or
Hugging Face's ``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import importlib.util
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from tunelab.litgpt_source import data_defaults
from tunelab.paths import project_path

USES_DATASETS = {"litgpt.data.Alpaca2k", "litgpt.data.LIMA", "litgpt.data.Deita"}
"""Modules that read their data through Hugging Face ``datasets`` (pinned in requirements.txt; not carried to the
GPU machine, whose random-weight runs read the benchmark JSON data)."""
HF_HOST = "huggingface.co"


def offline_declared() -> bool:
    """Whether the user said there is no network (``TUNELAB_OFFLINE=1`` or ``HF_HUB_OFFLINE=1``)."""
    return os.environ.get("TUNELAB_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"


def reachable(host: str, timeout: float = 3.0) -> bool:
    """Whether ``host`` answers on port 443 within ``timeout`` seconds (False when offline is declared)."""
    if offline_declared():
        return False
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _cached(directory: Path) -> bool:
    return directory.is_dir() and any(directory.iterdir())


def problem(args: dict) -> str | None:
    """One line saying why the run's data cannot be had here (None when it can, or is not a download)."""
    data = args.get("data")
    if not isinstance(data, dict) or not data.get("class_path"):
        return None
    cls = str(data["class_path"])
    init = {**data_defaults(cls), **(data.get("init_args") or {})}
    name = cls.rsplit(".", 1)[-1]
    fix = (
        "download it once where there is a network (the same command), or use your own file: "
        "--data JSON --data.json_path FILE"
    )
    download_dir = init.get("download_dir")
    if cls in USES_DATASETS:
        if importlib.util.find_spec("datasets") is None:
            return (
                f"data: {name} reads its data with Hugging Face `datasets`, which is not installed here; fix: "
                "pip install -c constraints.txt -r requirements.txt (it pins datasets), or --data JSON "
                "--data.json_path FILE"
            )
        if download_dir and _cached(project_path(download_dir)):
            return None
        if not reachable(HF_HOST):
            return f"data: {name} downloads from {HF_HOST}, which cannot be reached from here; fix: {fix}"
        return None
    url, file_name = init.get("file_url"), init.get("file_name")
    if url and download_dir:
        if file_name and (project_path(download_dir) / file_name).is_file():
            return None
        host = urlparse(str(url)).hostname or str(url)
        if not reachable(host):
            return (
                f"data: {name} downloads {file_name or url} from {host}, which cannot be reached from here; fix: {fix}"
            )
    return None
