"""The warehouse on disk: the Delta layer (the only code that knows paths, formats and engines),
the table schemas, and the state tables (clocks, ledger, batches) read as plain values.
"""
