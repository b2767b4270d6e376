"""Sources ``kafka2pc repair --source`` loads in the repair tests: the frame the run exported,
built again from the Parquet directory the test names in ``KAFKA2PC_TEST_REPAIR_PARQUET``."""

from __future__ import annotations

import os
from typing import Any


def parquet_frame(spark: Any) -> Any:
    """key and value of the test's Parquet files, one Spark partition per file."""
    return spark.read.parquet(os.environ["KAFKA2PC_TEST_REPAIR_PARQUET"]).select("key", "value")


def random_frame(spark: Any) -> Any:
    """A frame whose plan is not deterministic: a repair must refuse it before exporting."""
    from pyspark.sql import functions as F

    return parquet_frame(spark).withColumn("value", F.concat(F.col("value"), F.rand().cast("string")))
