"""kafka2pc: exactly-once export of Spark DataFrames to Apache Kafka, coordinated by Airflow."""

__version__ = "0.2.0.dev0"
