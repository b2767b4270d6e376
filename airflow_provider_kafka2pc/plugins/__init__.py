"""Airflow UI plugins of kafka2pc (Airflow 3.1+): the exporters page."""
