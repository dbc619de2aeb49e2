#!/usr/bin/env bash
# Validates deploy/ offline (run by tools/test.sh): the Kubernetes manifests against Kubernetes'
# own schemas (kubernetes-validate from PyPI, which carries them, in a venv under build/),
# then what schemas cannot check (tools/check-deploy.py: the InferencePool CRD's shape, and
# that manifests, metric names and probe paths agree with the code), then the HAProxy
# configuration with haproxy itself when it is installed (tools/cluster-test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/venv-deploy
if ! "$venv/bin/python" -c 'import kubernetes_validate, yaml' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q kubernetes-validate==1.37.0 pyyaml
fi
"$venv/bin/kubernetes-validate" --strict --quiet -k 1.30 deploy/k8s.yaml deploy/inference-pool.yaml
"$venv/bin/python" tools/check-deploy.py .
if command -v haproxy >/dev/null; then
  haproxy -c -q -f deploy/haproxy.cfg && echo "validate-deploy: haproxy accepts deploy/haproxy.cfg"
else
  echo "validate-deploy: haproxy not installed; deploy/haproxy.cfg not checked"
fi
echo "validate-deploy: ok"
