#!/usr/bin/env bash
# Entrypoint of the `spark` image target: runs a container as a Spark driver or executor on
# Kubernetes, or any other command.
#
#   spark-entrypoint.sh driver [spark-submit args...]
#       spark-submit in client deploy mode inside this pod (what Spark's Kubernetes cluster
#       mode starts in the driver pod, and what our CronJobs run directly). The driver binds
#       to SPARK_DRIVER_BIND_ADDRESS (set by Spark on Kubernetes), else POD_IP, else 0.0.0.0.
#   spark-entrypoint.sh executor
#       the executor backend, configured by the variables Spark's Kubernetes scheduler sets on
#       executor pods: SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, SPARK_EXECUTOR_CORES,
#       SPARK_EXECUTOR_MEMORY, SPARK_APPLICATION_ID, SPARK_EXECUTOR_POD_IP, and optionally
#       SPARK_EXECUTOR_POD_NAME, SPARK_RESOURCE_PROFILE_ID, SPARK_JAVA_OPT_<n>,
#       SPARK_EXECUTOR_JAVA_OPTS, SPARK_CLASSPATH, SPARK_EXTRA_CLASSPATH, SPARK_DIST_CLASSPATH.
#   spark-entrypoint.sh <anything else>
#       exec'd as is (e.g. `python -m automq.spark.ingest ...`, `bash`).
#
# SPARK_HOME defaults to the pip-installed pyspark (a complete Spark distribution), JAVA_HOME
# to the JRE that `java` on PATH belongs to.
set -euo pipefail

die() {
  echo "spark-entrypoint: $*" >&2
  exit 64 # EX_USAGE: the pod spec, not the program, is wrong
}

resolve_spark_home() {
  if [[ -z "${SPARK_HOME:-}" ]]; then
    SPARK_HOME="$(python3 -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null)" \
      || die "SPARK_HOME is not set and pyspark is not importable by python3"
  fi
  [[ -d "$SPARK_HOME/jars" ]] || die "SPARK_HOME=$SPARK_HOME has no jars/ directory"
  export SPARK_HOME
}

resolve_java_home() {
  if [[ -z "${JAVA_HOME:-}" ]]; then
    local java
    java="$(command -v java)" || die "JAVA_HOME is not set and no java on PATH"
    # .../jvm/<jre>/bin/java -> .../jvm/<jre>
    JAVA_HOME="$(dirname "$(dirname "$(readlink -f "$java")")")"
  fi
  [[ -x "$JAVA_HOME/bin/java" ]] || die "JAVA_HOME=$JAVA_HOME has no executable bin/java"
  export JAVA_HOME
}

require() {
  local name
  for name in "$@"; do
    [[ -n "${!name:-}" ]] || die "executor: $name is not set (Spark on Kubernetes sets it on executor pods)"
  done
}

run_driver() {
  resolve_spark_home
  resolve_java_home
  local bind="${SPARK_DRIVER_BIND_ADDRESS:-${POD_IP:-0.0.0.0}}"
  exec "$SPARK_HOME/bin/spark-submit" \
    --deploy-mode client \
    --conf "spark.driver.bindAddress=$bind" \
    "$@"
}

run_executor() {
  resolve_spark_home
  resolve_java_home
  require SPARK_DRIVER_URL SPARK_EXECUTOR_ID SPARK_EXECUTOR_CORES SPARK_EXECUTOR_MEMORY \
    SPARK_APPLICATION_ID SPARK_EXECUTOR_POD_IP

  # Spark passes the executor's JVM options as SPARK_JAVA_OPT_0..n, one option each, so that
  # options containing spaces survive; order matters (later wins), so sort numerically.
  local -a java_opts=()
  local var
  while IFS= read -r var; do
    [[ -n "$var" ]] && java_opts+=("${!var}")
  done < <(compgen -v SPARK_JAVA_OPT_ | sort -t_ -k4,4n)
  if [[ -n "${SPARK_EXECUTOR_JAVA_OPTS:-}" ]]; then
    # Space-separated by contract (no quoting), like spark.executor.extraJavaOptions.
    local -a extra
    read -r -a extra <<<"$SPARK_EXECUTOR_JAVA_OPTS"
    java_opts+=("${extra[@]}")
  fi

  local classpath="${SPARK_CLASSPATH:-}"
  for part in "${SPARK_EXTRA_CLASSPATH:-}" "$SPARK_HOME/jars/*" "${SPARK_DIST_CLASSPATH:-}"; do
    [[ -n "$part" ]] && classpath="${classpath:+$classpath:}$part"
  done

  # The Kubernetes backend (Spark >= 3.3) adds pod name and resource profile to the generic
  # coarse-grained one; fall back to the generic one for a Spark built without Kubernetes.
  local -a backend
  if compgen -G "$SPARK_HOME/jars/spark-kubernetes_*.jar" >/dev/null; then
    backend=(org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}")
    [[ -n "${SPARK_EXECUTOR_POD_NAME:-}" ]] && backend+=(--podName "$SPARK_EXECUTOR_POD_NAME")
  else
    backend=(org.apache.spark.executor.CoarseGrainedExecutorBackend)
  fi

  exec "$JAVA_HOME/bin/java" \
    "${java_opts[@]}" \
    "-Xms$SPARK_EXECUTOR_MEMORY" "-Xmx$SPARK_EXECUTOR_MEMORY" \
    -cp "$classpath" \
    "${backend[0]}" \
    --driver-url "$SPARK_DRIVER_URL" \
    --executor-id "$SPARK_EXECUTOR_ID" \
    --cores "$SPARK_EXECUTOR_CORES" \
    --app-id "$SPARK_APPLICATION_ID" \
    --hostname "$SPARK_EXECUTOR_POD_IP" \
    "${backend[@]:1}"
}

case "${1:-}" in
  driver)
    shift
    run_driver "$@"
    ;;
  executor)
    shift
    [[ $# -eq 0 ]] || die "executor takes no arguments (it is configured by environment variables), got: $*"
    run_executor
    ;;
  "")
    die "usage: spark-entrypoint.sh driver [spark-submit args...] | executor | <command> [args...]"
    ;;
  *)
    exec "$@"
    ;;
esac
