"""The weights files of a Hugging Face `save_pretrained` folder, for `model.init_from`.

`save_pretrained` writes the weights as one `model.safetensors`, or, past its
`max_shard_size`, as shards listed by `model.safetensors.index.json` (its
`weight_map`: tensor name -> shard file). Older versions write
`pytorch_model.bin` and `pytorch_model.bin.index.json` instead. `weight_files`
finds them, in that order of preference: safetensors first, since it holds
tensors only. The index is JSON, read as data; every shard it names must be a
file beside it (a name with a directory in it is refused), so that an index
cannot point the read anywhere else.
"""

from __future__ import annotations

import json
from pathlib import Path

WHOLE = ("model.safetensors", "pytorch_model.bin")
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def weight_files(folder: Path) -> list[Path]:
    """The files that hold the weights of `folder`: its one whole file, or every shard its index lists.

    Raises:
        ValueError: the folder holds none of `WHOLE` and `INDEXES`, or its index is not
            valid JSON with a `weight_map` of tensor names to shard files beside it, or a shard
            it lists is missing.
    """
    for name in (WHOLE[0], INDEXES[0], WHOLE[1], INDEXES[1]):
        path = folder / name
        if path.is_file():
            return [path] if name in WHOLE else _shards(path)
    raise ValueError(
        f"{folder} is a directory without model weights: a Hugging Face save_pretrained folder holds "
        f"{' or '.join(WHOLE)}, or {' or '.join(INDEXES)} with the shards it lists; "
        "name such a folder, or a weights file"
    )


def _shards(index: Path) -> list[Path]:
    """The shard files `index` lists, each once, in the order first named."""
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{index} is not a readable weights index ({type(exc).__name__}: {exc})") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index} has no 'weight_map' of tensor names to shard files")
    names = list(dict.fromkeys(weight_map.values()))
    bad = [n for n in names if not isinstance(n, str) or Path(n).name != n or n in ("", ".", "..")]
    if bad:
        raise ValueError(f"{index} lists shard(s) {bad[:3]} that are not file names beside it")
    missing = [n for n in names if not (index.parent / n).is_file()]
    if missing:
        raise ValueError(f"{index} lists shard(s) missing from {index.parent}: {', '.join(missing[:5])}")
    return [index.parent / n for n in names]
