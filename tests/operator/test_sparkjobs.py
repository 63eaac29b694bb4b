"""The Spark CronJobs: spec validation (cron, catalogs), the rendered manifests (valid for the
Kubernetes 1.31 schema, strict), and the status computed from CronJobs and Jobs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from automq.operator import sparkjobs
from automq.operator.builders import ClusterRef
from automq.operator.crd import build_crd
from automq.operator.cron import SCHEDULE_PATTERN, check_schedule
from automq.operator.rbac import OPERATOR_RULES
from automq.operator.spec import DEFAULT_SPARK_IMAGE, InvalidSpec, parse_spec

REF = ClusterRef("demo", "streaming", "uid-1")
STORE = {
    "bucket": "demo-bucket",
    "endpoint": "http://seaweedfs:8333",
    "pathStyle": True,
    "credentialsSecret": {"name": "s3-keys"},
}
LAKE = {"enabled": True, "catalogUri": "postgresql+psycopg://iceberg@pg:5432/catalog"}


def spec(**extra: Any) -> dict[str, Any]:
    return {"objectStore": dict(STORE), **extra}


@pytest.mark.parametrize(
    "schedule", ["*/5 * * * *", "0 3 * * MON-FRI", "@hourly", "0 0 1 jan ?", "5,10-20/2 */3 1-31 1-12 0-7", "0 0 * * 7"]
)
def test_cron_schedules_accepted_by_both_checks(schedule: str) -> None:
    assert check_schedule(schedule) == schedule
    assert re.match(SCHEDULE_PATTERN, schedule)


@pytest.mark.parametrize(
    ("schedule", "why", "pattern_rejects"),
    [
        ("61 * * * *", "minute 61 is outside 0-59", True),
        ("0 24 * * *", "hour 24 is outside 0-23", True),
        ("0 0 0 * *", "day of month 0 is outside 1-31", True),
        ("0 0 * 13 *", "month 13 is outside 1-12", True),
        ("* * * *", "expected 5 fields", True),
        ("5-1 * * * *", "range 5-1 starts after it ends", False),  # beyond a regular expression
        ("*/0 * * * *", "step '0' must be a positive number", False),
        ("CRON_TZ=UTC 0 * * * *", "put the time zone in timeZone", True),
        ("@often", "unknown macro", True),
        ("often", "expected 5 fields", True),
        (" 0 * * * *", "no leading or trailing spaces", True),
        ("? * * * *", "minute '?' is not a number", True),
    ],
)
def test_bad_cron_schedules_are_refused_naming_the_field(schedule: str, why: str, pattern_rejects: bool) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        check_schedule(schedule)
    assert (re.match(SCHEDULE_PATTERN, schedule) is None) == pattern_rejects
    with pytest.raises(InvalidSpec, match=r"spec\.compaction\.schedule"):
        parse_spec(spec(compaction={"schedule": schedule}))


@pytest.fixture(scope="module")
def spec_schema() -> jsonschema.Draft7Validator:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize(
    ("extra", "message", "schema_rejects"),
    [
        # Cross-field: the CRD's CEL rules refuse these (tests/operator/test_cel_rules.py).
        ({"lakeIngestion": {"enabled": True}}, "enabled needs catalogUri or catalogUriSecret", False),
        (
            {"lakeIngestion": {**LAKE, "catalogUriSecret": {"name": "cat", "key": "uri"}}},
            "catalogUri or catalogUriSecret, not both",
            False,
        ),
        ({"lakeIngestion": {**LAKE, "onlyListedTopics": True}}, "onlyListedTopics needs topics", False),
        ({"lakeIngestion": {**LAKE, "catalogUri": "ftp://x"}}, "spec.lakeIngestion.catalogUri", True),
        ({"lakeIngestion": {**LAKE, "warehouse": "/data"}}, "spec.lakeIngestion.warehouse", True),
        ({"lakeIngestion": {**LAKE, "topics": ["bad topic"]}}, "spec.lakeIngestion.topics.0", True),
        ({"compaction": {"minAge": "soon"}}, "spec.compaction.minAge", True),
        ({"compaction": {"targetSize": "big"}}, "spec.compaction.targetSize", True),
        ({"compaction": {"cores": 0}}, "spec.compaction.cores", True),
        ({"compaction": {"driverMemory": "1 GB"}}, "spec.compaction.driverMemory", True),
        ({"compaction": {"timeZone": "Europe/Berlin; rm"}}, "spec.compaction.timeZone", True),
        ({"compaction": {"keys": {"schedule": "0 99 * * *"}}}, "spec.compaction.keys.schedule", True),
        ({"compaction": {"backoffLimit": 11}}, "spec.compaction.backoffLimit", True),
    ],
)
def test_bad_job_specs_are_refused(
    extra: dict[str, Any], message: str, schema_rejects: bool, spec_schema: jsonschema.Draft7Validator
) -> None:
    raw = spec(**extra)
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(raw)
    assert message in str(caught.value)
    assert bool(list(spec_schema.iter_errors(raw))) == schema_rejects


def test_good_job_specs_pass_schema_cel_and_model(spec_schema: jsonschema.Draft7Validator) -> None:
    raw = spec(
        compaction={"enabled": True, "schedule": "*/10 * * * *", "timeZone": "Europe/Berlin", "minAge": "10m"},
        lakeIngestion={**LAKE, "topics": ["orders", "audit.v1"], "onlyListedTopics": True},
    )
    parse_spec(raw)
    assert list(spec_schema.iter_errors(raw)) == []


def rendered(**extra: Any) -> dict[str, dict[str, Any]]:
    return sparkjobs.desired_cron_jobs(parse_spec(spec(**extra)), REF)


def container(cron: dict[str, Any]) -> dict[str, Any]:
    return cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]


def test_disabled_jobs_render_nothing() -> None:
    assert rendered() == {}
    assert set(rendered(compaction={"enabled": True, "keys": {"enabled": False}})) == {"compaction"}


def test_cron_jobs_are_valid_kubernetes_objects_with_the_job_settings() -> None:
    jobs = rendered(
        compaction={
            "enabled": True,
            "schedule": "*/7 * * * *",
            "timeZone": "Europe/Berlin",
            "cores": 3,
            "driverMemory": "3g",
            "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}},
            "backoffLimit": 2,
            "failedJobsHistoryLimit": 5,
            "scheduling": {"nodeSelector": {"pool": "batch"}},
        },
        lakeIngestion={
            **LAKE,
            "topics": ["orders"],
            "expireSnapshotsOlderThan": "168h",
            "compactFilesBelow": "32MiB",
            "removeOrphansOlderThan": "72h",
        },
    )
    assert set(jobs) == {"compaction", "keyCompaction", "lakeIngestion"}
    for cron in jobs.values():
        kubernetes_validate.validate(cron, "1.31", strict=True)
        assert cron["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert cron["spec"]["concurrencyPolicy"] == "Forbid"
        pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        assert pod["restartPolicy"] == "Never"
        assert pod["serviceAccountName"] == "demo-spark" and pod["automountServiceAccountToken"] is False
        c = container(cron)
        assert c["image"] == DEFAULT_SPARK_IMAGE
        assert c["command"] == sparkjobs.ENTRYPOINT
        assert c["args"][0] == "driver" and sparkjobs.SPARK_JOB_FILE in c["args"]
        # the brokers' credentials, from the same Secret
        secret_refs = {
            e["name"]: e["valueFrom"]["secretKeyRef"]
            for e in c["env"]
            if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]
        }
        assert secret_refs["AWS_ACCESS_KEY_ID"] == {"name": "s3-keys", "key": "AWS_ACCESS_KEY_ID"}
        assert secret_refs["AWS_SECRET_ACCESS_KEY"] == {"name": "s3-keys", "key": "AWS_SECRET_ACCESS_KEY"}
    compact = jobs["compaction"]
    assert compact["metadata"]["name"] == "demo-compact"
    assert compact["spec"]["schedule"] == "*/7 * * * *" and compact["spec"]["timeZone"] == "Europe/Berlin"
    assert compact["spec"]["failedJobsHistoryLimit"] == 5
    assert compact["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 2
    pod = compact["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "batch"}
    args = container(compact)["args"]
    assert args[args.index("--master") + 1] == "local[3]" and args[args.index("--driver-memory") + 1] == "3g"
    job_args = args[args.index(sparkjobs.SPARK_JOB_FILE) + 1 :]
    assert job_args[:5] == [
        "compact",
        "--controller",
        "https://demo-controller-0.demo-controllers.streaming.svc:9093",
        "--object-store",
        "s3://demo-bucket?endpoint=http://seaweedfs:8333&region=us-east-1&path_style=true",
    ]
    assert container(compact)["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    keys = container(jobs["keyCompaction"])["args"]
    assert keys[keys.index(sparkjobs.SPARK_JOB_FILE) + 1 : keys.index(sparkjobs.SPARK_JOB_FILE) + 3] == [
        "compact",
        "--keys",
    ]
    assert jobs["keyCompaction"]["spec"]["schedule"] == "*/30 * * * *"
    ingest = container(jobs["lakeIngestion"])["args"]
    assert ingest[ingest.index("--catalog") + 1] == LAKE["catalogUri"]
    assert ingest[ingest.index("--warehouse") + 1] == "s3://demo-bucket/warehouse"
    assert "s3.endpoint=http://seaweedfs:8333" in ingest
    assert ingest[ingest.index("--expire-snapshots-older-than") + 1] == "168h"
    assert ingest[ingest.index("--compact-files-below") + 1] == "32MiB"
    assert ingest[ingest.index("--remove-orphans-older-than") + 1] == "72h"
    assert container(jobs["lakeIngestion"])["resources"] == sparkjobs.DEFAULT_JOB_RESOURCES
    kubernetes_validate.validate(sparkjobs.service_account(REF), "1.31", strict=True)


def _rule_pairs(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_executor_pods_render_spark_on_kubernetes_with_rbac_and_a_pod_template() -> None:
    parsed = parse_spec(
        spec(
            imagePullSecrets=["regcred"],
            compaction={
                "enabled": True,
                "executors": 4,
                "executorCores": 2,
                "executorMemory": "3g",
                "image": "registry.example/automq-spark:1",
                "scheduling": {"nodeSelector": {"pool": "batch"}},
                "keys": {"enabled": False},
            },
            lakeIngestion=LAKE,  # executors 0: local, unchanged
        )
    )
    jobs = sparkjobs.desired_cron_jobs(parsed, REF)
    compact, ingest = jobs["compaction"], jobs["lakeIngestion"]
    for cron in (compact, ingest):
        kubernetes_validate.validate(cron, "1.31", strict=True)
    pod = compact["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True  # the driver calls the API server
    assert ingest["spec"]["jobTemplate"]["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    c = container(compact)
    args = c["args"]
    assert args[:3] == ["driver", "--master", sparkjobs.K8S_MASTER]
    confs = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")
    assert confs["spark.executor.instances"] == "4" and confs["spark.executor.cores"] == "2"
    assert confs["spark.executor.memory"] == "3g"
    assert confs["spark.kubernetes.namespace"] == "streaming"
    assert confs["spark.kubernetes.container.image"] == "registry.example/automq-spark:1"
    assert confs["spark.kubernetes.container.image.pullSecrets"] == "regcred"
    # executors connect back to the driver's pod IP on the ports the container declares, and
    # are owned by the driver's pod (both names come from the downward API, expanded by the kubelet)
    env = {e["name"]: e for e in c["env"]}
    assert confs["spark.driver.host"] == "$(POD_IP)" and env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert confs["spark.kubernetes.driver.pod.name"] == "$(POD_NAME)"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    ports = {p["containerPort"] for p in c["ports"]}
    assert {int(confs["spark.driver.port"]), int(confs["spark.driver.blockManager.port"])} == ports
    assert confs["spark.kubernetes.authenticate.oauthTokenFile"].startswith(sparkjobs.SA_DIR)
    # the pod template: mounted from the ConfigMap at the path the conf names
    template_path = confs["spark.kubernetes.executor.podTemplateFile"]
    mount = next(m for m in c["volumeMounts"] if template_path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    cm = sparkjobs.executor_templates(parsed, REF)
    assert cm is not None and volume["configMap"]["name"] == cm["metadata"]["name"]
    kubernetes_validate.validate(cm, "1.31", strict=True)
    assert set(cm["data"]) == {"compaction.json"}
    template = json.loads(cm["data"][template_path.rsplit("/", 1)[1]])
    template["metadata"]["name"] = "x"
    template["spec"]["containers"][0]["image"] = "set-by-spark"
    kubernetes_validate.validate(template, "1.31", strict=True)
    tspec = template["spec"]
    assert tspec["automountServiceAccountToken"] is False and tspec["nodeSelector"] == {"pool": "batch"}
    assert tspec["imagePullSecrets"] == [{"name": "regcred"}]
    tc = tspec["containers"][0]
    assert tc["name"] == confs["spark.kubernetes.executor.podTemplateContainerName"]
    assert tc["securityContext"]["readOnlyRootFilesystem"] is True and tspec["securityContext"]["runAsNonRoot"]
    tenv = {e["name"]: e for e in tc["env"]}
    assert tenv["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "s3-keys"
    # RBAC: the jobs' ServiceAccount may manage executor pods, and the operator holds what it grants
    role, binding = sparkjobs.driver_role(parsed, REF), sparkjobs.driver_role_binding(REF)
    for obj in (role, binding):
        kubernetes_validate.validate(obj, "1.31", strict=True)
    granted = _rule_pairs(role["rules"])
    assert {("", "pods", v) for v in ("create", "watch", "delete", "deletecollection")} <= granted
    assert ("", "configmaps", "deletecollection") in granted
    assert granted <= _rule_pairs(OPERATOR_RULES)
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"] == binding["roleRef"]["name"]


def test_without_executor_pods_the_role_grants_nothing_and_no_template_is_rendered() -> None:
    parsed = parse_spec(spec(compaction={"enabled": True}))
    assert sparkjobs.driver_role(parsed, REF)["rules"] == []
    assert sparkjobs.executor_templates(parsed, REF) is None
    args = container(sparkjobs.desired_cron_jobs(parsed, REF)["compaction"])["args"]
    assert not any(a.startswith("spark.kubernetes.") for a in args)


def test_catalog_uri_from_a_secret_stays_out_of_the_args() -> None:
    cron = rendered(lakeIngestion={"enabled": True, "catalogUriSecret": {"name": "iceberg", "key": "uri"}})[
        "lakeIngestion"
    ]
    c = container(cron)
    assert "--catalog" not in c["args"]
    env = {e["name"]: e for e in c["env"]}
    assert env[sparkjobs.CATALOG_ENV]["valueFrom"]["secretKeyRef"] == {"name": "iceberg", "key": "uri"}


def test_rest_catalog_token_from_a_secret_stays_out_of_the_args() -> None:
    lake = {"enabled": True, "catalogUri": "https://rest:8181", "catalogTokenSecret": {"name": "rest", "key": "token"}}
    c = container(rendered(lakeIngestion=lake)["lakeIngestion"])
    assert not any("token" in a for a in c["args"])
    env = {e["name"]: e for e in c["env"]}
    assert env[sparkjobs.CATALOG_TOKEN_ENV]["valueFrom"]["secretKeyRef"] == {"name": "rest", "key": "token"}


def test_the_operator_may_manage_cron_jobs_and_read_their_jobs() -> None:
    verbs = {
        (resource, verb)
        for rule in OPERATOR_RULES
        if "batch" in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert {("cronjobs", v) for v in ("get", "create", "patch", "delete")} <= verbs
    assert ("jobs", "list") in verbs


def test_job_file_is_the_path_the_spark_image_links_it_to() -> None:
    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    spark_target = dockerfile[dockerfile.index("AS spark\n") :]
    link = re.search(r"import automq\.spark\.submit as m; print\(m\.__file__\)'\)\" (\S+)", spark_target)
    assert link, "the spark target links automq/spark/submit.py to a fixed path"
    assert link.group(1) == sparkjobs.SPARK_JOB_FILE
    assert "/usr/local/bin/spark-entrypoint.sh" in dockerfile and "/usr/bin/tini" in dockerfile


def _job(name: str, kind: str | None, at: str, message: str = "") -> dict[str, Any]:
    conditions = (
        [
            {
                "type": kind,
                "status": "True",
                "lastTransitionTime": at,
                "reason": "BackoffLimitExceeded",
                "message": message,
            }
        ]
        if kind
        else []
    )
    return {"metadata": {"name": name}, "status": {"startTime": at, "conditions": conditions}}


def test_status_reports_last_success_and_newest_failure() -> None:
    cron = {
        "metadata": {"name": "demo-compact"},
        "spec": {"schedule": "*/5 * * * *", "suspend": False},
        "status": {"lastScheduleTime": "2026-01-01T10:20:00Z", "active": [{"name": "demo-compact-3"}]},
    }
    jobs = [
        _job("demo-compact-1", "Failed", "2026-01-01T10:06:00Z", "Job has reached the specified backoff limit"),
        _job("demo-compact-2", "Complete", "2026-01-01T10:11:00Z"),
        _job("demo-compact-0", "Failed", "2026-01-01T10:01:00Z"),
        _job("demo-compact-3", None, "2026-01-01T10:20:00Z"),
    ]
    status = sparkjobs.job_status(cron, jobs)
    assert status.active == 1
    assert status.last_schedule_time == "2026-01-01T10:20:00Z"
    assert status.last_successful_time == "2026-01-01T10:11:00Z"
    assert status.last_failed_job == "demo-compact-1"
    assert status.last_failure_time == "2026-01-01T10:06:00Z"
    assert status.last_failure_message == "BackoffLimitExceeded: Job has reached the specified backoff limit"
    # The CronJob controller's own lastSuccessfulTime wins when it is newer (its Jobs were pruned).
    cron["status"]["lastSuccessfulTime"] = "2026-01-01T10:16:00Z"
    assert sparkjobs.job_status(cron, jobs).last_successful_time == "2026-01-01T10:16:00Z"
    assert sparkjobs.job_status(cron, []).last_failed_job is None
