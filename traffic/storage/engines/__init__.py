"""The two ways a table is written (DESIGN §8): ``spark`` (delta-spark) and ``rs`` (Spark or Arrow
writes parquet, delta-rs commits). Only ``traffic.storage.warehouse`` picks one."""
