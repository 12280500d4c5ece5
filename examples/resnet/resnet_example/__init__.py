"""A torchvision-style ResNet and a small image dataset that makes its own images (see ../README.md)."""
