"""Validates deploy/kubernetes (the Kustomize base) for tests/deploy_config.rs.

Every manifest listed in kustomization.yaml, and only those, is checked against the Kubernetes
OpenAPI schemas that the `kubernetes-validate` package ships (strict: an unknown field is an
error). The Prometheus Operator kinds (ServiceMonitor, PodMonitor, PrometheusRule) are CRDs
whose schemas that package does not ship: they are skipped with the reason printed, and checked
here instead for what the base relies on (the PrometheusRule's groups are alerts/*.rules.yml's,
which the caller also runs through promtool). Every Secret and ConfigMap a workload mounts or
references must be defined by the base, with the key it reads.

Prints one JSON object: {"validated": [...], "skipped": [...], "errors": [...], "rules": PATH}.
"""

import json
import os
import sys

import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.31"
CRD_GROUPS = ("monitoring.coreos.com/",)


def main(root, rules_out):
    base = os.path.join(root, "deploy", "kubernetes")
    kustomization = yaml.safe_load(open(os.path.join(base, "kustomization.yaml")))
    errors, validated, skipped = [], [], []
    listed = kustomization.get("resources", [])
    on_disk = sorted(
        f for f in os.listdir(base) if f.endswith(".yaml") and f != "kustomization.yaml"
    )
    for f in on_disk:
        if f not in listed:
            errors.append(f"{f} is not listed in kustomization.yaml's resources")
    docs = []
    for f in listed:
        path = os.path.join(base, f)
        if not os.path.isfile(path):
            errors.append(f"kustomization.yaml lists {f}, which does not exist")
            continue
        for doc in yaml.safe_load_all(open(path)):
            if doc:
                docs.append((f, doc))

    # What the base defines: generated Secrets (name -> keys) and ConfigMaps.
    secrets = {}
    for g in kustomization.get("secretGenerator", []):
        keys = set()
        for entry in g.get("files", []):
            key, _, source = entry.partition("=")
            keys.add(key)
            if not source.startswith("secrets/"):
                errors.append(f"secret {g['name']}: {source} is not under secrets/")
        secrets[g["name"]] = keys
    if secrets and not os.path.isfile(os.path.join(base, "secrets", "README.md")):
        errors.append("secrets/README.md, which says how to create the Secrets' files, is missing")
    config_maps = {
        d["metadata"]["name"]: set(d.get("data", {})) for _, d in docs if d.get("kind") == "ConfigMap"
    }

    rule_groups = None
    for f, doc in docs:
        kind = doc.get("kind", "?")
        name = doc.get("metadata", {}).get("name", "?")
        what = f"{f}: {kind}/{name}"
        if doc.get("metadata", {}).get("namespace") not in (None, "gpuledger") and kind != "Namespace":
            errors.append(f"{what}: namespace {doc['metadata']['namespace']!r}, not gpuledger")
        if doc.get("apiVersion", "").startswith(CRD_GROUPS):
            skipped.append(
                f"{what}: a Prometheus Operator CRD; kubernetes-validate ships no schema for it"
            )
            if kind == "PrometheusRule":
                rule_groups = doc["spec"]["groups"]
            for endpoint in doc.get("spec", {}).get("endpoints", []):
                cred = endpoint.get("authorization", {}).get("credentials")
                if cred and cred["key"] not in secrets.get(cred["name"], set()):
                    errors.append(f"{what}: reads Secret {cred['name']} key {cred['key']}, not defined")
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            validated.append(what)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            errors.append(f"{what}: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(f"{what}: no schema: {e}")
        pod = doc.get("spec", {}).get("template", {}).get("spec")
        if pod:
            for v in pod.get("volumes", []):
                if "secret" in v and v["secret"]["secretName"] not in secrets:
                    errors.append(f"{what}: mounts Secret {v['secret']['secretName']}, not defined")
                if "configMap" in v and v["configMap"]["name"] not in config_maps:
                    errors.append(f"{what}: mounts ConfigMap {v['configMap']['name']}, not defined")
            for c in pod.get("containers", []):
                for env in c.get("env", []):
                    ref = env.get("valueFrom", {}).get("secretKeyRef")
                    if ref and ref["key"] not in secrets.get(ref["name"], set()):
                        errors.append(f"{what}: env {env['name']} reads Secret {ref['name']} key {ref['key']}, not defined")

    # The exporter DaemonSet: GPU nodes only, the kubelet socket read-only, the node name from
    # the downward API.
    ds = [d for _, d in docs if d.get("kind") == "DaemonSet"]
    if len(ds) != 1:
        errors.append(f"{len(ds)} DaemonSets, expected the exporter's")
    else:
        pod = ds[0]["spec"]["template"]["spec"]
        if not pod.get("nodeSelector") and not pod.get("affinity"):
            errors.append("the exporter DaemonSet is not limited to GPU nodes")
        mounts = {m["name"]: m for c in pod["containers"] for m in c.get("volumeMounts", [])}
        sockets = [v for v in pod["volumes"] if v.get("hostPath", {}).get("path", "").startswith("/var/lib/kubelet/pod-resources")]
        if not sockets or not mounts.get(sockets[0]["name"], {}).get("readOnly"):
            errors.append("the kubelet's pod-resources socket is not mounted read-only")
        env = {e["name"]: e for c in pod["containers"] for e in c.get("env", [])}
        if env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "spec.nodeName":
            errors.append("NODE_NAME does not come from the downward API (spec.nodeName)")
    sts = [d for _, d in docs if d.get("kind") == "StatefulSet" and d["metadata"]["name"] == "gpuledger-aggregator"]
    if not sts or not sts[0]["spec"].get("volumeClaimTemplates"):
        errors.append("the aggregator StatefulSet has no PersistentVolumeClaim template")

    # The PrometheusRule carries alerts/*.rules.yml's groups, unchanged.
    alerts = os.path.join(root, "alerts")
    expected = []
    for f in sorted(os.listdir(alerts)):
        if f.endswith(".rules.yml"):
            expected += yaml.safe_load(open(os.path.join(alerts, f)))["groups"]
    if rule_groups is None:
        errors.append("no PrometheusRule in the base")
    else:
        if sorted(json.dumps(g, sort_keys=True) for g in rule_groups) != sorted(
            json.dumps(g, sort_keys=True) for g in expected
        ):
            errors.append("the PrometheusRule's groups differ from alerts/*.rules.yml")
        with open(rules_out, "w") as out:
            yaml.safe_dump({"groups": rule_groups}, out, sort_keys=False, width=1000)

    print(json.dumps({"validated": validated, "skipped": skipped, "errors": errors, "rules": rules_out}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
