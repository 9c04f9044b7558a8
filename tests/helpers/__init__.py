"""Helpers the tests share (not tests themselves): running the real DAG, tiny models and data."""
