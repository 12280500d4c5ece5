"""Small file helpers shared by the launcher and the engine (no torch import)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


def write_json_atomic(path: str | os.PathLike, data: Any, **dumps_options: Any) -> None:
    """Write `data` as JSON through a temporary file beside `path`, then rename it over `path`.

    A reader never sees half a file. `dumps_options` go to `json.dumps`; its
    TypeError/ValueError (a value JSON cannot hold) is raised before anything is written.
    """
    path = Path(path)
    text = json.dumps(data, **dumps_options)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
