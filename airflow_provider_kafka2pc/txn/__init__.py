"""Kafka transaction mechanics for kafka2pc.

Nothing in this package imports Airflow or Spark: it runs on Spark executors, in Airflow
workers and in the stand-alone CLI alike.
"""
