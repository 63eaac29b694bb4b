"""The Spark session the jobs run in, with the `automq` data source registered.

`spark-submit` (the CronJobs) or `automq spark ...` creates it; an existing active session
(tests share one, notebooks bring their own) is reused and only gets the data source.
"""

from __future__ import annotations

import logging
import os
import sys

from pyspark.sql import SparkSession

from automq.spark.source import AutoMQDataSource


def spark_session(master: str | None = None, app_name: str = "automq", shuffle_partitions: int = 4) -> SparkSession:
    active = SparkSession.getActiveSession()
    if active is not None:
        spark = active
    else:
        # Python workers (data source planning and reads, UDFs) must run this interpreter:
        # the one with the project installed
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = SparkSession.builder.appName(app_name)
        master = master or os.environ.get("AUTOMQ_SPARK_MASTER")
        # Under spark-submit (the CronJobs) its --master is already in the JVM's conf; a master
        # set here would override it.
        if master is not None or "PYSPARK_GATEWAY_PORT" not in os.environ:
            builder = builder.master(master or "local[*]")
        builder = (
            builder.config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")  # job logs, not a terminal
            .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        )
        spark = builder.getOrCreate()
    spark.dataSource.register(AutoMQDataSource)
    # py4j logs "closing" from finalizers at interpreter exit, after logging shut down
    logging.getLogger("py4j").setLevel(logging.WARNING)
    return spark
