"""deploy/: every manifest validates against a current Kubernetes schema (kubernetes-validate), and its
ports, probes and command lines are ones the clasp CLI accepts."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from clasp.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.33.0"  # a current release; kubernetes-validate bundles its schemas


def documents():
    for f in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc:
                yield f.name, doc


def containers():
    for _, doc in documents():
        if doc["kind"] in ("Deployment", "StatefulSet"):
            for c in doc["spec"]["template"]["spec"]["containers"]:
                yield doc, c


@pytest.mark.parametrize("name,doc", list(documents()), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_every_manifest_validates(name, doc):
    if doc["apiVersion"].startswith("monitoring.coreos.com"):
        # A CRD of the Prometheus Operator: not in the core schema; check its shape here.
        assert doc["kind"] == "ServiceMonitor" and doc["spec"]["endpoints"][0]["port"] == "metrics"
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_command_lines_parse_and_ports_and_probes_match():
    parser = build_parser()
    seen = set()
    for doc, c in containers():
        args = [re.sub(r"\$\((\w+)\)", "x", a) for a in c["args"]]
        ns = parser.parse_args(args)  # exits (SystemExit) on anything the CLI does not accept
        seen.add(ns.command)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["metrics"] == ns.metrics_port == int(_value(args, "--metrics-port"))
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = c[probe]["httpGet"]
            assert get["path"] == path and get["port"] == "metrics"
        ann = doc["spec"]["template"]["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == ns.metrics_port
        if ns.command == "planner":
            assert ports["zmq"] == ns.port and ns.provider == "kubernetes"
            assert ns.statefulset == "clasp-worker"
        else:
            assert ports["data"] == ns.data_port and ports["state"] == ns.state_port
            assert doc["kind"] == "StatefulSet"
            assert doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > ns.leave_timeout
    assert seen == {"planner", "worker"}


def test_the_planner_may_scale_only_the_worker_statefulset():
    docs = [d for _, d in documents()]
    role = next(d for d in docs if d["kind"] == "Role")
    assert {n for r in role["rules"] for n in r["resourceNames"]} == {"clasp-worker"}
    assert {v for r in role["rules"] for v in r["verbs"]} <= {"get", "patch", "update"}
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert sts["metadata"]["name"] == "clasp-worker"
    planner = next(d for d in docs if d["kind"] == "Deployment")
    assert planner["spec"]["template"]["spec"]["serviceAccountName"] == "clasp-planner"
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "clasp-planner")
    assert {p["port"] for p in service["spec"]["ports"]} == {5555, 9100}
