# The two commands of the README: `make demo` and `make test` (each sets itself up).
.PHONY: setup demo test test-fast airflow screenshots
setup:
	@bash scripts/setup.sh
demo: setup
	@.venv/bin/traffic demo
test: setup
	@bash scripts/test.sh
test-fast: setup
	@bash scripts/test.sh -m "not slow"
airflow: setup
	@bash scripts/airflow.sh
screenshots: setup
	@UPDATE_DOC_IMAGES=1 bash scripts/test.sh tests/integration/test_report.py tests/integration/test_report_bills.py tests/e2e
