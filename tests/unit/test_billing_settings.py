"""Billing settings: validated on load like every other setting, with messages a person can act on."""

from __future__ import annotations

from pathlib import Path

import pytest

from traffic.core.settings import SettingsError, load_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "traffic" / "conf" / "accounts.toml"


def test_defaults_bill_everything_as_unassigned_by_utc_calendar_month():
    settings = load_settings(environ={})
    assert (settings.accounts_file, settings.billing_rule, settings.billing_cycle_day, settings.billing_timezone,
            settings.billing_unknown_direction) == (None, "max", 1, "UTC", "in")


def test_every_source_sets_them_and_the_example_mapping_loads(tmp_path):
    config = tmp_path / "traffic.toml"
    config.write_text(f'[traffic]\naccounts_file = "{EXAMPLE}"\nbilling_rule = "sum"\n')
    settings = load_settings(config, environ={"TRAFFIC_BILLING_CYCLE_DAY": "15",
                                              "TRAFFIC_BILLING_TIMEZONE": "Europe/Berlin"},
                             overrides={"billing_unknown_direction": "out"})
    assert settings.accounts_file == EXAMPLE
    assert (settings.billing_rule, settings.billing_cycle_day, settings.billing_timezone,
            settings.billing_unknown_direction) == ("sum", 15, "Europe/Berlin", "out")
    assert settings.replace(keep_hours=3).accounts_file == EXAMPLE


@pytest.mark.parametrize("overrides, message", [
    ({"billing_rule": "avg"}, "billing_rule: 'avg' is not one of max, sum"),
    ({"billing_cycle_day": "29"}, "billing_cycle_day: 29 is after the 28th"),
    ({"billing_cycle_day": "0"}, "billing_cycle_day: 0 must be at least 1"),
    ({"billing_timezone": "Mars/Olympus"}, "billing_timezone: 'Mars/Olympus' is not an IANA time zone"),
    ({"billing_unknown_direction": "up"}, "billing_unknown_direction: 'up' is not one of in, out, both, ignore"),
    ({"billing_rule": "sum", "billing_unknown_direction": "both"}, "would bill unknown traffic twice"),
])
def test_bad_billing_settings_are_refused(overrides, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")):
        load_settings(environ={}, overrides=overrides)


def test_a_bad_accounts_file_is_refused_with_its_file_and_line(tmp_path):
    path = tmp_path / "accounts.toml"
    path.write_text('[[version]]\neffective_from = 2026-01-01\n[version.accounts]\nacme = ["10.1.2.3/16"]\n')
    with pytest.raises(SettingsError) as error:
        load_settings(environ={"TRAFFIC_ACCOUNTS_FILE": str(path)})
    assert str(error.value) == (f"accounts_file: {path}:4: version 1 (2026-01-01), account 'acme': '10.1.2.3/16' "
                                f"has host bits set; did you mean '10.1.0.0/16'?")
    with pytest.raises(SettingsError, match=f"accounts_file: accounts file {tmp_path / 'nope.toml'} does not exist"):
        load_settings(environ={}, overrides={"accounts_file": tmp_path / "nope.toml"})
