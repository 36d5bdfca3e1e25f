"""fs3: a distributed file system for AI training and inference (see README.md and DESIGN.md)."""

__version__ = "0.1.0"
