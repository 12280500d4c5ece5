"""A small classifier for points in the plane."""

from torch import nn


class SpiralNet(nn.Module):
    """An MLP of ReLU layers. (With tanh layers it barely learns the spirals in a short run: on
    points within the unit disc a tanh net starts almost linear, and a linear boundary leaves
    the focal loss at its chance value, 0.173, for hundreds of steps.)"""

    def __init__(self, hidden: int = 64, classes: int = 2):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes)
        )

    def forward(self, points):
        return self.layers(points)
