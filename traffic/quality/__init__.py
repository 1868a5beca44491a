"""Data quality: the Great Expectations suites run on every output before it is published,
their results, Data Docs.
"""
