"""Where the Spark work runs: the session, the warm Spark Connect server, the JVM's flags, memory.
"""
