"""Jobs for the kubelet harness: the Job controller and kubelet for `batch/v1` Jobs (e.g. the
operator's WAL-recovery Job), each attempt a real process: `python -m automq.broker.cli <args>`
for the runtime image (its entrypoint is `automq`), and for a container that names its `command`
(the Spark CronJobs' `tini -- spark-entrypoint.sh driver ... submit.py compact ...`) exactly that
command and those args, with the image's files mapped to this checkout (`IMAGE_FILES`: the
entrypoint script, the job file spark-submit runs) and the image's environment (`SPARK_HOME`,
`PYSPARK_PYTHON`); `tini --` is left out (the harness is the process's parent and reaps it).
`trigger_cron_job(name)` is `kubectl create job --from=cronjob/<name>`: a Job from the
CronJob's jobTemplate (labels, owner reference), with the CronJob's `lastScheduleTime`/`active`
kept as the CronJob controller keeps them (and `lastSuccessfulTime` once a run succeeds).

Per Job in the namespace without a Complete/Failed condition and no attempt running: a Pod
`<job>-<n>` (labels `job-name`, restartPolicy Never) scheduled on a Ready Node its
`nodeAffinity` allows (matchFields metadata.name NotIn / In, and nodeSelector on hostname), its
volumes attached by `Volumes.attach` (a volume still attached to a lost node blocks it unless
released or multi-attach), then the process runs with the container's env (kubelet rules) and
its args translated to this host: an arg under a volume mount points into the volume's host
directory, `http(s)://<name>.svc...` URLs go through `map_url`, and with an `object_store_url`
override the `--object-store` value is replaced. Exit 0: Pod Succeeded, Job `succeeded: 1`
and condition Complete; else Pod Failed, `failed += 1`, retried until `backoffLimit`, then
condition Failed. The attempt's output: `<root>/logs/<pod>.log`; `JobRunner.runs` records
(job, pod, node, args, exit code).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark

from automq.operator import sparkjobs

REPO = Path(__file__).resolve().parents[2]
# Files of the images, and where the same code is in this checkout.
IMAGE_FILES = {
    "/usr/local/bin/spark-entrypoint.sh": str(REPO / "scripts" / "spark-entrypoint.sh"),
    sparkjobs.SPARK_JOB_FILE: str(Path(importlib.util.find_spec("automq.spark.submit").origin)),  # type: ignore[arg-type, union-attr]
}
# The spark image's ENV (Dockerfile `spark` target), for this machine.
SPARK_IMAGE_ENV = {
    "SPARK_HOME": str(Path(pyspark.__file__).parent),
    "PYSPARK_PYTHON": sys.executable,
    "PYSPARK_DRIVER_PYTHON": sys.executable,
    "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
}


@dataclass
class JobRun:
    job: str
    pod: str
    node: str
    args: list[str]
    process: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None


class JobRunner:
    def __init__(self, harness: Any) -> None:
        self.h = harness
        self.runs: list[JobRun] = []
        self._running: dict[str, JobRun] = {}
        self._blocked: dict[str, str] = {}  # job -> why its pod cannot start yet
        self._not_before: dict[str, float] = {}  # job -> retry back-off after a failed attempt
        self._triggered: dict[str, list[str]] = {}  # CronJob -> Jobs created from it

    async def step(self) -> None:
        api, ns = self.h.api, self.h.namespace
        jobs = (await api._request("GET", f"/apis/batch/v1/namespaces/{ns}/jobs") or {}).get("items") or []
        for job in jobs:
            name = job["metadata"]["name"]
            status = job.get("status") or {}
            done = any(
                c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                for c in status.get("conditions") or []
            )
            run = self._running.get(name)
            if run is not None:
                if run.process is not None and run.process.poll() is not None:
                    await self._finished(job, run)
                continue
            if (
                not done
                and not job["metadata"].get("deletionTimestamp")
                and time.monotonic() >= self._not_before.get(name, 0.0)
            ):
                await self._start(job)
        names = {j["metadata"]["name"] for j in jobs}
        for name, run in list(self._running.items()):
            if name not in names and run.process is not None and run.process.poll() is None:
                run.process.kill()  # the Job was deleted: its pod goes with it
                del self._running[name]

    def _node_for(self, spec: dict[str, Any]) -> str | None:
        excluded: set[str] = set()
        required: set[str] | None = None
        affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        for term in affinity.get("nodeSelectorTerms") or []:
            for field in term.get("matchFields") or []:
                if field.get("key") != "metadata.name":
                    continue
                if field.get("operator") == "NotIn":
                    excluded |= set(field.get("values") or [])
                elif field.get("operator") == "In":
                    required = set(field.get("values") or [])
        hostname = (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")
        if hostname:
            required = {hostname}
        with self.h.state.lock:
            ready = [n for n, s in self.h.state.nodes.items() if s.ready]
        for node in sorted(ready):
            if node not in excluded and (required is None or node in required):
                return node
        return None  # the caller makes a new Node (a required one that is not Ready never comes)

    async def _start(self, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        spec = job["spec"]["template"]["spec"]
        container = spec["containers"][0]
        node = self._node_for(spec)
        if node is None:
            node = (await self.h._new_node()).name
        attempt = len([r for r in self.runs if r.job == name])
        pod_name = f"{name}-{attempt}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": self.h.namespace,
                "uid": str(uuid.uuid4()),
                "labels": {**(job["spec"]["template"].get("metadata") or {}).get("labels", {}), "job-name": name},
                "ownerReferences": [
                    {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "", "controller": True}
                ],
            },
            "spec": {**spec, "nodeName": node},
            "status": {"phase": "Pending"},
        }
        claims = [
            v["persistentVolumeClaim"]["claimName"] for v in spec.get("volumes") or [] if v.get("persistentVolumeClaim")
        ]
        for claim in claims:
            why = await self.h.volumes.attach(claim, node, self.h._node_ready, self.h._claim_in_use)
            if why is not None:
                if self._blocked.get(name) != why:
                    self._blocked[name] = why
                    self.h._record(f"job blocked: {why}", pod_name)
                return  # try again next tick (a real Job pod would wait in ContainerCreating)
        self._blocked.pop(name, None)
        await self.h.api.create(pod)
        mounts = self._mounts(spec, container, pod_name)
        args = [self._translate(a, mounts, job) for a in container.get("args") or []]
        env = await self.h._container_env(pod, container)
        command = [c for c in container.get("command") or [] if c not in ("/usr/bin/tini", "--")]
        if command:
            argv = [IMAGE_FILES.get(c, c) for c in command] + args
            if argv[0].endswith(".sh"):
                argv.insert(0, "bash")
            env = {**SPARK_IMAGE_ENV, **env}
        else:
            argv = [sys.executable, "-m", "automq.broker.cli", *args]
        log_path = self.h.root / "logs" / f"{pod_name}.log"
        run = JobRun(job=name, pod=pod_name, node=node, args=args)
        with open(log_path, "ab", buffering=0) as out:
            run.process = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            )
        self.runs.append(run)
        self._running[name] = run
        self.h._record("job started", pod_name)
        await self.h.api.patch("Pod", self.h.namespace, pod_name, {"status": {"phase": "Running"}})
        await self.h.api.patch("Job", self.h.namespace, name, {"status": {"active": 1, "startTime": _now()}})

    def _mounts(self, spec: dict[str, Any], container: dict[str, Any], pod_name: str) -> dict[str, Path]:
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        out: dict[str, Path] = {}
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"]) or {}
            if volume.get("persistentVolumeClaim"):
                out[mount["mountPath"]] = self.h.volumes.host_dir(volume["persistentVolumeClaim"]["claimName"])
            else:
                path = self.h.root / "pods" / pod_name / mount["name"]
                path.mkdir(parents=True, exist_ok=True)
                out[mount["mountPath"]] = path
        return out

    def _translate(self, arg: str, mounts: dict[str, Path], job: dict[str, Any]) -> str:
        if arg in IMAGE_FILES:
            return IMAGE_FILES[arg]
        if "," in arg and re.match(r"^https?://[^/]+\.svc", arg):  # a list of controller URLs
            return ",".join(self.h.map_url(u) for u in arg.split(","))
        for mount_path in sorted(mounts, key=len, reverse=True):
            if arg == mount_path or arg.startswith(mount_path.rstrip("/") + "/"):
                return str(mounts[mount_path]) + arg[len(mount_path.rstrip("/")) :]
        if re.match(r"^https?://[^/]+\.svc", arg):
            return self.h.map_url(arg)
        if arg.startswith("s3://") or arg.startswith("file://"):
            cluster = (job["metadata"].get("labels") or {}).get("app.kubernetes.io/instance", "")
            return self.h._object_store_for(cluster) or arg
        return arg

    async def _finished(self, job: dict[str, Any], run: JobRun) -> None:
        name = job["metadata"]["name"]
        assert run.process is not None
        run.exit_code = run.process.returncode
        del self._running[name]
        ok = run.exit_code == 0
        self.h._record(f"job exited {run.exit_code}", run.pod)
        for claim in [
            v["persistentVolumeClaim"]["claimName"]
            for v in job["spec"]["template"]["spec"].get("volumes") or []
            if v.get("persistentVolumeClaim")
        ]:
            await self.h.volumes.detach(claim, run.node)
        await self.h.api.patch("Pod", self.h.namespace, run.pod, {"status": {"phase": "Succeeded" if ok else "Failed"}})
        status = job.get("status") or {}
        if ok:
            patch = {
                "active": 0,
                "succeeded": 1,
                "completionTime": _now(),
                "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": _now()}],
            }
        else:
            failed = int(status.get("failed") or 0) + 1
            patch = {"active": 0, "failed": failed}
            if failed > int(job["spec"].get("backoffLimit", 6)):
                patch["conditions"] = [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                        "lastTransitionTime": _now(),
                    }
                ]
            else:
                self._not_before[name] = time.monotonic() + min(10.0, 0.5 * 2**failed)
        await self.h.api.patch("Job", self.h.namespace, name, {"status": patch})
        cron = next(
            (o["name"] for o in job["metadata"].get("ownerReferences") or [] if o.get("kind") == "CronJob"), None
        )
        if cron is not None and (ok or "conditions" in patch):
            cron_status: dict[str, Any] = {"active": None}
            if ok:
                cron_status["lastSuccessfulTime"] = _now()
            await self.h.api.patch("CronJob", self.h.namespace, cron, {"status": cron_status})

    async def trigger_cron_job(self, name: str) -> str:
        """`kubectl create job --from=cronjob/<name>`: the Job the CronJob controller would start."""
        api, ns = self.h.api, self.h.namespace
        cron = await api.get("CronJob", ns, name)
        assert cron is not None, f"no CronJob {name}"
        n = len(self._triggered.setdefault(name, []))
        job_name = f"{name}-{n}"
        template = cron["spec"]["jobTemplate"]
        await api.create(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": job_name,
                    "namespace": ns,
                    "uid": str(uuid.uuid4()),
                    "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                    "ownerReferences": [
                        {
                            "apiVersion": "batch/v1",
                            "kind": "CronJob",
                            "name": name,
                            "uid": cron["metadata"].get("uid", ""),
                            "controller": True,
                        }
                    ],
                },
                "spec": template["spec"],
            }
        )
        self._triggered[name].append(job_name)
        await api.patch(
            "CronJob",
            ns,
            name,
            {"status": {"lastScheduleTime": _now(), "active": [{"kind": "Job", "name": job_name, "namespace": ns}]}},
        )
        return job_name

    def kill_all(self) -> None:
        for run in self._running.values():
            if run.process is not None and run.process.poll() is None:
                run.process.kill()


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
