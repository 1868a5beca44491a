"""Traffic accounting lakehouse: packet headers in, hourly/daily/monthly accounting out."""

__version__ = "0.1.0"
