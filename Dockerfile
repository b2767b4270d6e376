# Images for docker-compose.yml: Airflow and a Spark worker, each with this repository's package.
# Build: docker compose build (the context is the repository root).
ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.11
ARG SPARK_IMAGE=apache/spark:4.2.0-scala2.13-java17-python3-ubuntu
# The Spark driver (in the Airflow task) and the executors must run the same Python minor version.
ARG PYTHON_VERSION=3.11

FROM ${AIRFLOW_IMAGE} AS airflow
USER root
# The prepare task runs the Spark driver, a JVM.
RUN apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless \
 && rm -rf /var/lib/apt/lists/*
USER airflow
COPY --chown=airflow:0 . /opt/kafka2pc
# The locked versions are the ones CI tests; pyspark goes last, as in scripts/setup, so its files
# win over pyspark-client's (the apache-spark provider, for dags/kafka2pc_spark_submit.py, needs it).
RUN pip install --no-cache-dir -c /opt/kafka2pc/requirements.lock "/opt/kafka2pc[airflow,spark]" \
      apache-airflow-providers-apache-spark \
 && pip install --no-cache-dir --no-deps --force-reinstall "$(grep '^pyspark==' /opt/kafka2pc/requirements.lock)"

FROM ${SPARK_IMAGE} AS spark
ARG PYTHON_VERSION
USER root
COPY . /opt/kafka2pc-src
# The executors write the transactions with the package's own writer. The image's Python is
# Ubuntu's, older than the package needs, so uv brings the driver's version, readable by user spark.
ENV UV_PYTHON_INSTALL_DIR=/opt/uv-python
RUN python3 -m pip install --no-cache-dir uv==0.9.30 \
 && uv venv --python "${PYTHON_VERSION}" /opt/kafka2pc \
 && uv pip install --no-cache --python /opt/kafka2pc/bin/python -c /opt/kafka2pc-src/requirements.lock \
      "/opt/kafka2pc-src[spark]" \
 && rm -rf /opt/kafka2pc-src
# Executors start "python3" (PySpark's default) from the worker's PATH: the venv's.
ENV PATH=/opt/kafka2pc/bin:${PATH}
USER spark
