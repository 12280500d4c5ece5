"""The digests of the files a run reads, recorded in env.json when it starts (`data_files`).

Every path key of the config (a field marked `rule(path=True)`: data.path,
data.train_path, data.eval_path, model.init_from, ...) that names an existing
file or folder when the run starts is recorded as
`{"data.path": {"path": ABSOLUTE, "sha256": HEX, "bytes": N}}`; a folder's digest
covers each file under it, by relative name and content. The checkpoint group's
keys are left out: checkpoint.dir and checkpoint.path are what the run writes, and a
resumed checkpoint is checked against its own digests when it is read.

`clorch-runs verify` compares these with a rerun's to name a data file that changed
since the run. Hashing reads each file once (about a second per GB at the start of
the run); a path key of your own dataset's `_target_` arguments is not a config path
key and is not recorded.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from clorch.config.registry import path_keys

# The checkpoint group's paths are the run's own outputs (and a resume point verified on load).
_OUTPUT_GROUPS = ("checkpoint",)
_CHUNK = 1 << 20


def data_files(config: Any) -> dict[str, dict[str, Any]]:
    """`{"group.key": {"path", "sha256", "bytes"}}` for each input path key of `config` (a
    TrainConfig, its paths absolute) that names an existing file or folder now."""
    found = {}
    for name in path_keys():
        group, _, key = name.partition(".")
        value = getattr(getattr(config, group, None), key, None)
        if group in _OUTPUT_GROUPS or not isinstance(value, str) or not value:
            continue
        path = Path(value).expanduser()
        try:
            if path.is_file():
                found[name] = {"path": str(path), "sha256": _file_sha256(path), "bytes": path.stat().st_size}
            elif path.is_dir():
                found[name] = {"path": str(path), **_folder_sha256(path)}
        except OSError as exc:  # unreadable now: the run's own read will say why
            found[name] = {"path": str(path), "sha256": None, "error": exc.strerror or str(exc)}
    return found


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _folder_sha256(folder: Path) -> dict[str, Any]:
    """A digest of every file under `folder` (its relative name and its sha256, in name order)."""
    digest, total = hashlib.sha256(), 0
    for directory, subdirs, files in os.walk(folder):
        subdirs.sort()
        for name in sorted(files):
            path = Path(directory, name)
            if not path.is_file():
                continue
            digest.update(f"{path.relative_to(folder).as_posix()}\0{_file_sha256(path)}\n".encode())
            total += path.stat().st_size
    return {"sha256": digest.hexdigest(), "bytes": total}
