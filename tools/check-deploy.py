#!/usr/bin/env python3
"""check-deploy.py: what Kubernetes' own schemas cannot check in deploy/ (tools/validate-deploy.sh
runs it after them): that the manifests agree with each other and with the code.

- the InferencePool (a CRD: no schema in Kubernetes) has the v1 shape: selector.matchLabels
  choosing the quern pods, one target port that is their container port, an endpointPickerRef
  naming the picker's Service and its port; the HTTPRoute sends to that pool
- every metric the picker is told to read is one quern exports (server/metrics.c)
- every probe path is a route the daemon serves (server/http.c); readiness and liveness differ
- each pod's grace period outlasts its --drain-timeout plus its preStop sleep
"""
import re
import sys

import yaml

ROOT = sys.argv[1] if len(sys.argv) > 1 else "."
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)


def load(name):
    with open(f"{ROOT}/deploy/{name}") as f:
        return [d for d in yaml.safe_load_all(f) if d]


k8s, pool_docs = load("k8s.yaml"), load("inference-pool.yaml")
by_kind = {}
for d in k8s + pool_docs:
    by_kind.setdefault(d["kind"], []).append(d)
metrics_c = open(f"{ROOT}/server/metrics.c").read()
http_c = open(f"{ROOT}/server/http.c").read()
routes = set(re.findall(r'\{"(/[^"]*)", "GET"', http_c))

quern_deps = [d for d in by_kind["Deployment"] if d["metadata"]["name"].startswith("quern-")
              and d["metadata"]["name"] != "quern-epp"]
check(quern_deps, "deploy/k8s.yaml has quern Deployments")
for dep in quern_deps:
    name = dep["metadata"]["name"]
    spec = dep["spec"]["template"]["spec"]
    c = spec["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        path = c.get(probe, {}).get("httpGet", {}).get("path")
        check(path in routes, f"{name}: {probe} path {path} is a route of server/http.c")
    check(c["readinessProbe"]["httpGet"]["path"] != c["livenessProbe"]["httpGet"]["path"],
          f"{name}: readiness and liveness probe different things")
    drain = next((int(a.split("=")[1]) for a in c["args"] if a.startswith("--drain-timeout=")), 30)
    pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    sleep = int(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else 0
    check(spec["terminationGracePeriodSeconds"] > drain + sleep,
          f"{name}: grace {spec['terminationGracePeriodSeconds']} s > drain {drain} + preStop {sleep}")

pool = by_kind["InferencePool"][0]
check(pool["apiVersion"] == "inference.networking.k8s.io/v1", "InferencePool is v1")
ps = pool["spec"]
labels = ps["selector"]["matchLabels"]
for dep in quern_deps:
    pod = dep["spec"]["template"]["metadata"]["labels"]
    check(all(pod.get(k) == v for k, v in labels.items()),
          f"the pool's selector {labels} picks {dep['metadata']['name']}'s pods")
    ports = [p["containerPort"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]]
    check(len(ps["targetPorts"]) == 1 and ps["targetPorts"][0]["number"] in ports,
          f"the pool's target port is a container port of {dep['metadata']['name']} {ports}")
ref = ps["endpointPickerRef"]
svc = next((s for s in by_kind["Service"] if s["metadata"]["name"] == ref["name"]), None)
check(svc is not None and ref.get("kind", "Service") == "Service",
      f"endpointPickerRef names a Service ({ref['name']})")
if svc:
    check(any(p["port"] == ref["port"]["number"] for p in svc["spec"]["ports"]),
          "endpointPickerRef's port is the picker Service's")
check(ref.get("failureMode", "FailClose") in ("FailOpen", "FailClose"), "failureMode")
epp = next(d for d in by_kind["Deployment"] if d["metadata"]["name"] == "quern-epp")
args = epp["spec"]["template"]["spec"]["containers"][0]["args"]
for flag in ("total-queued-requests-metric", "total-running-requests-metric",
             "kv-cache-usage-percentage-metric", "cache-info-metric"):
    val = next((a.split("=", 1)[1] for a in args if a.startswith(f"--{flag}=")), None)
    check(val is not None, f"the picker is given --{flag}")
    if val:
        check(re.search(r'"' + re.escape(val) + r'[ {"]', metrics_c) is not None,
              f"--{flag}={val} is a metric server/metrics.c exports")
check(f"--pool-name={pool['metadata']['name']}" in args, "the picker watches this pool")
route = by_kind["HTTPRoute"][0]
backs = [b for r in route["spec"]["rules"] for b in r["backendRefs"]]
check(any(b.get("kind") == "InferencePool" and b["name"] == pool["metadata"]["name"] and
          b.get("group") == "inference.networking.k8s.io" for b in backs),
      "the HTTPRoute sends to the InferencePool")

if fails:
    print("check-deploy: FAIL\n  " + "\n  ".join(fails))
    sys.exit(1)
print(f"check-deploy: ok ({len(quern_deps)} quern Deployments, the pool, its picker and route "
      f"agree with each other and with server/metrics.c and server/http.c)")
