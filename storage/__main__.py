"""``python -m fs3.storage``: the same as ``fs3 storage``."""

import sys

from fs3.storage.main import main

sys.exit(main(sys.argv[1:]))
