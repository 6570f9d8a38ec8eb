"""Runnable examples for the guides in docs/ (tests/test_examples.py runs each of them).

Run them from the repository root as modules, e.g. ``python -m examples.my_processor``, so that
``examples.*`` import paths resolve. They are not installed with the package.
"""
