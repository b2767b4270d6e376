"""The Spark versions kafka2pc is tested with, and the facts that differ between them.

Lines 3.5, 4.0, 4.1, 4.2 and 4.3 run the real-broker Spark suites (``scripts/test-compat``; the
matrix is in docs/install.md); any patch release of a line is accepted. What differs between them
and matters here:

- the Scala binary version of Spark's own artifacts (spark-sql-kafka, spark-avro): pip's pyspark
  3.5 runs Scala 2.12, 4.x runs 2.13. It is read from the Spark that will run, before its JVM
  starts (the operator names the packages in ``spark.jars.packages`` then): the ``spark-core_*``
  jar of ``$SPARK_HOME/jars`` or of pyspark's own ``jars`` folder gives the Scala suffix and the
  Spark version in one name;
- the Arrow batches Spark hands ``mapInArrow``: bounded by bytes as well as records from 4.0
  (``spark.sql.execution.arrow.maxBytesPerBatch``), by records only in 3.5.

``check_supported`` refuses, by name and before anything is written, a PySpark outside these lines,
a mixed install (pyspark and pyspark-client, which ship the same ``pyspark`` package, in two
versions) and a pyarrow older than the lowest tested.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_kafka2pc.spark.errors import UnsupportedVersionError
from airflow_provider_kafka2pc.txn.kafka.message_arrays import pyarrow_unsupported

# (major, minor) of every Spark line the suites run on; the newest is the highest accepted.
TESTED_LINES = ((3, 5), (4, 0), (4, 1), (4, 2), (4, 3))
# Spark's Arrow byte bound of a batch (spark.sql.execution.arrow.maxBytesPerBatch) exists from 4.0.
FIRST_WITH_ARROW_BYTE_BOUND = (4, 0)
_CORE_JAR = re.compile(r"spark-core_(\d+\.\d+)-(\d+\.\d+\.\d+[^/]*)\.jar$")


@dataclass(frozen=True)
class SparkBuild:
    """The Spark a session of this process runs: its version and its Scala binary version."""

    version: str
    scala: str

    def package(self, artifact: str) -> str:
        """The Maven coordinate of one of Spark's own artifacts (``spark-avro``) for this build."""
        return f"org.apache.spark:{artifact}_{self.scala}:{self.version}"


def line(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as ``3.5.9`` or ``4.1.0.dev1``."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise UnsupportedVersionError(f"PySpark reports the version {version!r}, which is not major.minor.patch")
    return int(found.group(1)), int(found.group(2))


def _default_scala(version: str) -> str:
    # pip's pyspark: Scala 2.12 up to 3.5, 2.13 from 4.0 (Spark 4 dropped 2.12).
    return "2.12" if line(version) < (4, 0) else "2.13"


def jars_dir() -> Path | None:
    """The folder of the jars the session's JVM will load: ``$SPARK_HOME/jars`` when set (PySpark's
    launcher uses it), else pyspark's own; None for pyspark-client (Spark Connect: no local JVM)."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home) / "jars"
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    return jars if jars.is_dir() else None


def spark_build(jars: Path | None = None) -> SparkBuild:
    """The Spark whose JVM a session of this process starts, read from its ``spark-core`` jar's name;
    without one (no jars folder), PySpark's version and the Scala its pip package ships."""
    import pyspark

    folder = jars if jars is not None else jars_dir()
    if folder is not None and folder.is_dir():
        for jar in sorted(folder.glob("spark-core_*.jar")):
            found = _CORE_JAR.search(jar.name)
            if found:
                return SparkBuild(version=found.group(2), scala=found.group(1))
    return SparkBuild(version=pyspark.__version__, scala=_default_scala(pyspark.__version__))


def has_arrow_byte_bound(version: str) -> bool:
    """Whether this Spark bounds ``mapInArrow``'s batches by bytes (4.0 on) or by records only."""
    return line(version) >= FIRST_WITH_ARROW_BYTE_BOUND


def unsupported_pyspark(version: str) -> str | None:
    """Why this PySpark version is outside the tested lines, or None."""
    if line(version)[:2] in TESTED_LINES:
        return None
    lines = ", ".join(f"{a}.{b}" for a, b in TESTED_LINES)
    return f"PySpark {version} is not one of the Spark lines kafka2pc is tested with ({lines})"


def mixed_install() -> str | None:
    """Why the installed ``pyspark`` package is a mix of two distributions' files, or None.

    pyspark and pyspark-client both install the ``pyspark`` package; in two versions, the files of
    the one installed last replace the other's only where both have a file."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("pyspark", "pyspark-client"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    if len(found) == 2 and found["pyspark"] != found["pyspark-client"]:
        return (
            f"pyspark {found['pyspark']} and pyspark-client {found['pyspark-client']} are both installed, and "
            "both install the pyspark package: its files are a mix of the two versions"
        )
    return None


def check_supported(pyspark_version: str | None = None) -> None:
    """Refuse, before anything is written, a PySpark, an install or a pyarrow that kafka2pc is not
    tested with; raises ``UnsupportedVersionError`` naming the version and the fix."""
    if pyspark_version is None:
        import pyspark

        pyspark_version = pyspark.__version__
    why = unsupported_pyspark(pyspark_version)
    if why is not None:
        raise UnsupportedVersionError(
            f"{why}; nothing was written. Run the export with pyspark 3.5.x, 4.0.x, 4.1.x, 4.2.x or 4.3.x "
            "(docs/install.md has the tested versions)"
        )
    why = mixed_install()
    if why is not None:
        raise UnsupportedVersionError(
            f"{why}; nothing was written. Keep one of them: uninstall both, then install pyspark (a local or "
            "cluster Spark) or pyspark-client (Spark Connect) alone, in one version (the kafka2pc extras "
            "'spark' and 'spark-connect' each bring one)"
        )
    why = pyarrow_unsupported()
    if why is not None:
        raise UnsupportedVersionError(f"{why}; nothing was written. Install a newer pyarrow")


__all__ = [
    "FIRST_WITH_ARROW_BYTE_BOUND",
    "TESTED_LINES",
    "SparkBuild",
    "check_supported",
    "has_arrow_byte_bound",
    "jars_dir",
    "line",
    "mixed_install",
    "spark_build",
    "unsupported_pyspark",
]
