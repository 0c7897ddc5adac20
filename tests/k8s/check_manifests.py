#!/usr/bin/env python3
"""Validates every object of configs/k8s/*.yaml against the schemas in
configs/k8s/schemas/ (README.md there names their sources), and checks that
the podFailurePolicy follows docs/cli.md's exit-code table.

  JobSet                  the JobSet CRD's openAPIV3Schema (v1alpha2), verbatim
  TrainJob, ClusterTrainingRuntime
                          Kubeflow Trainer v2's CRDs (v1alpha1), verbatim
  Deployment, StatefulSet, Service
                          Kubernetes' own schemas (v1.32.2, standalone-strict
                          JSON Schema, as yannh/kubernetes-json-schema writes
                          them from the API's OpenAPI), verbatim; the pod
                          templates are also checked against the JobSet CRD's
                          PodTemplateSpec

Unknown fields are errors, as under `kubectl apply --validate=strict`: every
object schema with properties and no additionalProperties (and no
x-kubernetes-preserve-unknown-fields) gets additionalProperties: false.

Usage: check_manifests.py REPO_ROOT        exit 0, or 1 with one line per problem
       check_manifests.py REPO_ROOT --self-test   also proves a broken copy fails
"""
import copy
import glob
import json
import os
import re
import sys

import jsonschema
import yaml


def strict(schema):
    """The schema with unknown fields refused (a copy)."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            # OpenAPI's int-or-string has no JSON Schema type.
            if node.get("x-kubernetes-int-or-string"):
                node.pop("type", None)
                node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    return s


def load_schemas(root):
    base = os.path.join(root, "configs", "k8s", "schemas")
    with open(os.path.join(base, "jobset.x-k8s.io_jobsets.yaml")) as f:
        crd = yaml.safe_load(f)
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    jobset = strict(versions["v1alpha2"]["schema"]["openAPIV3Schema"])
    pod_template = (jobset["properties"]["spec"]["properties"]["replicatedJobs"]["items"]
                    ["properties"]["template"]["properties"]["spec"]["properties"]["template"])
    core = {}
    for kind, name in (("Deployment", "deployment-apps-v1"),
                       ("StatefulSet", "statefulset-apps-v1"), ("Service", "service-v1")):
        with open(os.path.join(base, f"{name}.json")) as f:
            core[kind] = strict(json.load(f))
    trainer = {}
    for kind, name in (("TrainJob", "trainjobs"),
                       ("ClusterTrainingRuntime", "clustertrainingruntimes")):
        with open(os.path.join(base, f"trainer.kubeflow.org_{name}.yaml")) as f:
            crd = yaml.safe_load(f)
        versions = {v["name"]: v for v in crd["spec"]["versions"]}
        trainer[("trainer.kubeflow.org/v1alpha1", kind)] = strict(
            versions["v1alpha1"]["schema"]["openAPIV3Schema"])
    return {
        **trainer,
        ("jobset.x-k8s.io/v1alpha2", "JobSet"): jobset,
        ("apps/v1", "Deployment"): core["Deployment"],
        ("apps/v1", "StatefulSet"): core["StatefulSet"],
        ("v1", "Service"): core["Service"],
    }, pod_template


def problems_of(doc, where, schemas, pod_template):
    """The schema violations of one object, one line each."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key not in schemas:
        return [f"{where}: no schema for apiVersion {key[0]} kind {key[1]}; add it to "
                "configs/k8s/schemas/ or use a kind listed in its README"]
    checks = [(schemas[key], doc, "")]
    if key[1] in ("Deployment", "StatefulSet"):
        checks.append((pod_template, doc.get("spec", {}).get("template", {}), "spec.template."))
    out = []
    for schema, obj, prefix in checks:
        for e in jsonschema.Draft7Validator(schema).iter_errors(obj):
            path = prefix + ".".join(str(p) for p in e.absolute_path)
            out.append(f"{where}: {key[1]} {path or '(top)'}: {e.message}")
    return out


def exit_codes_from_docs(root):
    """docs/cli.md's exit-code table: {code: meaning}."""
    text = open(os.path.join(root, "docs", "cli.md")).read()
    table = text.split("## Exit codes of ddprun", 1)[1].split("\n## ", 1)[0]
    return {int(m.group(1)): m.group(2)
            for m in re.finditer(r"^\| `(\d+)` \| (.*) \|$", table, re.M)}


def replicated_jobs(doc):
    """The JobSet spec's replicatedJobs: a JobSet's own, or the one a
    ClusterTrainingRuntime's template stamps out."""
    spec = doc.get("spec", {})
    if doc.get("kind") == "ClusterTrainingRuntime":
        spec = spec.get("template", {}).get("spec", {})
    return spec.get("replicatedJobs", [])


def policy_problems(doc, where, documented):
    """podFailurePolicy: FailJob on the permanent codes (1, 2) only, Count on
    retryable ones; every code named must be in docs/cli.md's table, and every
    rule must name a container of the pod (else Kubernetes never applies it)."""
    out = []
    for rj in replicated_jobs(doc):
        job = rj["template"]["spec"]
        rules = job.get("podFailurePolicy", {}).get("rules", [])
        if not rules:
            out.append(f"{where}: replicatedJob {rj['name']} has no podFailurePolicy")
        containers = {c.get("name") for c in
                      job.get("template", {}).get("spec", {}).get("containers", [])}
        fail = set()
        for r in rules:
            codes = set(r.get("onExitCodes", {}).get("values", []))
            named = r.get("onExitCodes", {}).get("containerName")
            if named is not None and named not in containers:
                out.append(f"{where}: podFailurePolicy names container {named!r}, but the pod "
                           f"has {sorted(containers)}")
            for c in codes:
                if c not in documented and not 129 <= c <= 192:
                    out.append(f"{where}: exit code {c} is not in docs/cli.md's table")
            if r["action"] == "FailJob":
                fail |= codes
        if fail != {1, 2}:
            out.append(f"{where}: FailJob must name exactly the permanent exit codes 1 "
                       f"(out of restarts) and 2 (usage error), got {sorted(fail)}")
    return out


def check(root, files):
    schemas, pod_template = load_schemas(root)
    documented = exit_codes_from_docs(root)
    problems, count = [], 0
    for path in files:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        for i, doc in enumerate(docs):
            where = f"{os.path.relpath(path, root)}[{i}]"
            count += 1
            problems += problems_of(doc, where, schemas, pod_template)
            if doc.get("kind") in ("JobSet", "ClusterTrainingRuntime"):
                problems += policy_problems(doc, where, documented)
    return problems, count


def main():
    root = sys.argv[1]
    files = sorted(glob.glob(os.path.join(root, "configs", "k8s", "*.yaml")))
    problems, count = check(root, files)
    for p in problems:
        print(p)
    if problems:
        return 1
    kinds = set()
    for path in files:
        with open(path) as f:
            kinds |= {d["kind"] for d in yaml.safe_load_all(f) if d}
    for needed in ("JobSet", "Deployment", "StatefulSet", "Service", "TrainJob",
                   "ClusterTrainingRuntime"):
        if needed not in kinds:
            print(f"configs/k8s/ has no {needed}")
            return 1
    if "--self-test" in sys.argv:
        # A misspelt field, a wrong type and a policy that fails on a retryable
        # code must each be caught: the check can fail.
        schemas, pod_template = load_schemas(root)
        with open(os.path.join(root, "configs", "k8s", "jobset.yaml")) as f:
            good = yaml.safe_load(f)
        broken = []
        typo = copy.deepcopy(good)
        typo["spec"]["replicatedJobs"][0]["replica"] = 1
        broken.append(typo)
        wrong_type = copy.deepcopy(good)
        wrong_type["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = "two"
        broken.append(wrong_type)
        for b in broken:
            if not problems_of(b, "self-test", schemas, pod_template):
                print("self-test: a broken JobSet passed the schema")
                return 1
        retry_fails = copy.deepcopy(good)
        rules = retry_fails["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]
        rules["rules"][0]["onExitCodes"]["values"].append(3)
        if not policy_problems(retry_fails, "self-test", exit_codes_from_docs(root)):
            print("self-test: FailJob on the retryable exit code 3 passed")
            return 1
        with open(os.path.join(root, "configs", "k8s", "trainjob.yaml")) as f:
            runtime, trainjob = list(yaml.safe_load_all(f))
        typo = copy.deepcopy(trainjob)
        typo["spec"]["trainer"]["numNode"] = typo["spec"]["trainer"].pop("numNodes")
        if not problems_of(typo, "self-test", schemas, pod_template):
            print("self-test: a misspelt field in the TrainJob passed")
            return 1
        wrong_type = copy.deepcopy(runtime)
        wrong_type["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
            "backoffLimit"] = "three"
        if not problems_of(wrong_type, "self-test", schemas, pod_template):
            print("self-test: a wrong type in the ClusterTrainingRuntime passed")
            return 1
        retry_fails = copy.deepcopy(runtime)
        job = retry_fails["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
        job["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"].append(3)
        if not policy_problems(retry_fails, "self-test", exit_codes_from_docs(root)):
            print("self-test: the runtime's FailJob on the retryable exit code 3 passed")
            return 1
        other_container = copy.deepcopy(runtime)
        job = other_container["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
        job["podFailurePolicy"]["rules"][0]["onExitCodes"]["containerName"] = "ddprun"
        if not policy_problems(other_container, "self-test", exit_codes_from_docs(root)):
            print("self-test: a podFailurePolicy naming no container of the pod passed")
            return 1
        with open(os.path.join(root, "configs", "k8s", "ddprund.yaml")) as f:
            deployment = [d for d in yaml.safe_load_all(f) if d["kind"] == "Deployment"][0]
        deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"][
            "paht"] = "/"
        if not problems_of(deployment, "self-test", schemas, pod_template):
            print("self-test: a misspelt probe field in the Deployment's pod passed")
            return 1
        # Kubernetes' own schemas, outside the pod template: a misspelt
        # Service field and a wrong StatefulSet type.
        with open(os.path.join(root, "configs", "k8s", "ddprund.yaml")) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        service = copy.deepcopy([d for d in docs if d["kind"] == "Service"][0])
        service["spec"]["clusterIp"] = service["spec"].pop("clusterIP", "None")
        if not problems_of(service, "self-test", schemas, pod_template):
            print("self-test: a misspelt field in the Service passed")
            return 1
        with open(os.path.join(root, "configs", "k8s", "etcd.yaml")) as f:
            sts = [d for d in yaml.safe_load_all(f) if d and d["kind"] == "StatefulSet"][0]
        sts["spec"]["podManagementPolicy"] = 3
        if not problems_of(sts, "self-test", schemas, pod_template):
            print("self-test: a wrong type in the StatefulSet passed")
            return 1
    print(f"{count} objects in {len(files)} files valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
