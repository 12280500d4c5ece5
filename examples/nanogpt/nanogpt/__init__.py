"""nanoGPT's model.py, unmodified (https://github.com/karpathy/nanoGPT, MIT license: LICENSE)."""
