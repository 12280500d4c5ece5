"""The config groups' options, one module per group (or per option): each registers its
dataclasses with `clorch.config.registry.option`. Every module here is imported when the
registry is first read, so a new option is one new file (docs/extending.md)."""
