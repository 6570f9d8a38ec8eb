"""The ``coevo`` command line."""
