"""The accounts files the billing tests share (TOML text, as an operator writes it)."""

#: acme and globex from October 2026 on.
V1 = """
[[version]]
name = "v1"
effective_from = 2026-10-01

[version.accounts]
acme = ["10.0.0.0/24"]
globex = ["10.0.1.0/24"]
"""

#: The operator's change effective 2026-10-31 12:00: half of globex's range moves to acme.
V2 = """
[[version]]
name = "v2"
effective_from = 2026-10-31T12:00:00Z

[version.accounts]
acme = ["10.0.0.0/24", "10.0.1.128/25"]
globex = ["10.0.1.0/25"]
"""
