"""The command line and the demo: argument parsing, printing, exit codes.
"""
