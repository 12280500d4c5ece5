"""The shipped recipes: the `recipe` config group (`clorch-train +recipe=NAME`)."""
