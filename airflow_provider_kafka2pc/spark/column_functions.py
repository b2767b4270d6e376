"""Spark's column functions of the kind a frame takes: Spark Connect's for a Connect frame, classic
ones for a classic frame.

``pyspark.sql.functions`` picks the kind for the whole process (``SPARK_CONNECT_MODE_ENABLED``, which
the generic builder's ``remote()`` sets), not for the frame at hand. A Connect session made with
``pyspark.sql.connect.session.SparkSession.builder`` leaves it unset, and a frame of it then refuses
the classic columns ``pyspark.sql.functions`` makes ("'Column' object is not callable"), also in a
process that holds a classic session beside it (measured on the emulated cluster and in the
benchmark). The export builds its columns with the module this answers for the frame's session.
Where the generic builder set the variable, a classic frame of the same process gets Connect's
columns from ``pyspark.sql.functions``: pyspark itself refuses to start a classic session there.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


def is_connect(frame_or_session: Any) -> bool:
    """Whether a DataFrame or SparkSession is Spark Connect's (its class lives in ``pyspark.sql.connect``)."""
    return type(frame_or_session).__module__.startswith("pyspark.sql.connect.")


def functions_for(frame_or_session: Any) -> ModuleType:
    """The ``functions`` module whose columns ``frame_or_session`` takes."""
    if is_connect(frame_or_session):
        from pyspark.sql.connect import functions as connect_functions

        return connect_functions
    from pyspark.sql import functions

    return functions


def avro_functions_for(frame_or_session: Any) -> ModuleType:
    """The ``to_avro``/``from_avro`` module whose columns ``frame_or_session`` takes
    (``pyspark.sql.avro.functions`` too picks the kind for the whole process)."""
    if is_connect(frame_or_session):
        from pyspark.sql.connect.avro import functions as connect_avro

        return connect_avro
    from pyspark.sql.avro import functions as classic_avro

    return classic_avro


__all__ = ["avro_functions_for", "functions_for", "is_connect"]
