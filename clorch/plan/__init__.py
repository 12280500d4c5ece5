"""From a checked config and this machine to the launch plan every rank runs.

plan.py         the front door: `plan_or_errors`, `Plan` (what the ranks receive)
checks.py       the plan's checks of the machine, the data's sizes, memory and the filesystem
data.py         the data a config names: its splits, sizes and task (built lazily, with torch)
model.py        the model a config names, and the data sizes it gets
user_checks.py  your own model, data, loss and step, tried on the meta device before launch
resume.py       does the checkpoint to resume fit this run

clorch.config below it describes and checks configs without torch; this package may
import torch lazily (to size a model on the meta device) and builds what a config names.
"""
