"""What people run: the run lifecycle, the command line, the UDP collector for flow telemetry,
the demo; argument parsing, printing, exit codes.
"""
