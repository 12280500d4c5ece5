"""Benchmarks: `clorch-bench SUBCOMMAND`. Each compares clorch with its peer in one interleaved run."""
