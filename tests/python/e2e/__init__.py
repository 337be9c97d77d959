"""Helpers of the end-to-end suite (tests/python/test_e2e_suite.py)."""
