"""`python -m clorch.cli ...` is `clorch-train ...`."""

from clorch.cli.train import main

main()
