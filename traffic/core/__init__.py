"""Pure rules of the contract: the event-time clock and its periods, what a valid record is,
accounts and billing rules, settings. Nothing here reads or writes the warehouse or starts Spark.
"""
