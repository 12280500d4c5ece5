"""A small classifier for points in the plane."""

from torch import nn


class SpiralNet(nn.Module):
    def __init__(self, hidden: int = 64, classes: int = 2):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                    nn.Linear(hidden, classes))

    def forward(self, points):
        return self.layers(points)
