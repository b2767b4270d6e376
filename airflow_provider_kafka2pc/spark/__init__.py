"""The Spark side of the export: the partition writer job (prepare phase)."""
