"""The accounting itself: ingest and its executor tasks, freezing and its tasks, panes, roll-ups,
expiry, replay and restatements, bills. Driver modules call Spark; `*_tasks` run on executors.
"""
