"""Write byte-level token files for the recipe: data/train.bin and data/val.bin.

nanoGPT's `prepare.py` scripts write a flat array of uint16 token ids; this one does the same
with the bytes of a text (vocab_size 256), so the example needs no download and no tokenizer.
By default the text is nanoGPT's own model.py, beside this script: python prepare.py [TEXT_FILE]
"""

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def prepare(text_file: Path, out_dir: Path, eval_fraction: float = 0.1) -> None:
    ids = np.frombuffer(Path(text_file).read_bytes(), dtype=np.uint8).astype(np.uint16)
    cut = int(len(ids) * (1 - eval_fraction))
    out_dir.mkdir(parents=True, exist_ok=True)
    ids[:cut].tofile(out_dir / "train.bin")
    ids[cut:].tofile(out_dir / "val.bin")
    print(f"{out_dir}: {cut:,} training and {len(ids) - cut:,} held-out tokens")


if __name__ == "__main__":
    prepare(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "nanogpt" / "model.py", Path("data"))
