import sys

from airflow_provider_kafka2pc.cli.commands import main

sys.exit(main())
