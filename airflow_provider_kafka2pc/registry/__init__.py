"""Schema registry formats: a Confluent-compatible registry's client, the key and value formats
(Avro, JSON Schema), subject naming and the driver-side resolution of a schema id. No Spark, no
Airflow here: the Spark encoding is ``spark/record_formats.py``, the connection ``hooks/schema_registry.py``."""
