"""The ``fs3`` command line."""
