"""``python -m fs3.mgmtd``: the same as ``fs3 mgmtd``."""

import sys

from fs3.mgmtd.main import main

sys.exit(main(sys.argv[1:]))
