"""Input: the inbox (which files are new, and exactly which bytes a batch reads) and the readers
that turn those bytes into judged Arrow rows (text formats, packet captures, flow telemetry).
"""
