"""What the Airflow DAGs call: the short-circuit conditions and the task helpers.
"""
