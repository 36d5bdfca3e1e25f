"""fs3: a distributed file system for AI training and inference (see README.md and DESIGN.md)."""

from pathlib import Path as _Path

__version__ = "0.1.0"

# In a source checkout, meta/, storage/ and client/ sit beside fs3/ and an installed package maps them
# to fs3.meta, fs3.storage and fs3.client. When this package is imported straight from the checkout
# (the checkout on sys.path ahead of the editable install's finder, as pytest and `python -m` do from
# the repository root), let the checkout's root serve those sub-packages too.
_root = _Path(__file__).resolve().parent.parent
if (_root / "pyproject.toml").is_file() and (_root / "meta" / "__init__.py").is_file():
    __path__.append(str(_root))
