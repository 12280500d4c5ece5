"""From a checked config and the machine its ranks run on to the launch plan every rank runs.

plan.py         the front door: `plan_or_errors`, `Plan` (what the ranks receive)
checks.py       the plan's checks of the machine, the data's sizes, memory and the filesystem
memory.py       what a rank's training state needs of its GPU and host memory
user_checks.py  your own model, data, loss and step, tried on the meta device before launch
resume.py       does the checkpoint to resume fit this run
where.py        the machine the ranks run on: this one, a launcher plugin's nodes, or any (--cfg job)
machine.py      what an option needs of that machine (a package, CUDA, a compute capability)
interrupted.py  an interrupt behind an error of your code's is raised again, never a config error

clorch.config below it describes and checks configs without torch; this package may
import torch lazily (to size a model on the meta device) and builds what a config names
through clorch.builders.
"""
