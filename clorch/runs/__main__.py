"""`python -m clorch.runs ...` is `clorch-runs ...`."""

from clorch.runs.cli import main

main()
