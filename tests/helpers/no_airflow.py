"""Source text that makes a fresh interpreter refuse every airflow import (for ``python -c``)."""

REFUSE_AIRFLOW = """
import sys
from importlib.abc import MetaPathFinder

class NoAirflow(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "airflow" or name.startswith("airflow."):
            raise ImportError("the CLI must not import " + name)
        return None

sys.meta_path.insert(0, NoAirflow())
"""
