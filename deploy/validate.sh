#!/usr/bin/env bash
# Validates the bundle in deploy/ (or DIR) offline:
# - the manifests of core kinds against the Kubernetes API schemas that
#   kubernetes-validate ships: the newest it knows and 1.30, the oldest that has
#   every field the DaemonSet uses (recursiveReadOnly). Strict: an unknown field
#   fails too, and so does a kind it has no schema for (it would only warn).
# - the Prometheus Operator's kinds, which it has no schema for, by
#   bundle-check.py: the kustomizations name every file and every file exists, the
#   Service and the monitors select the DaemonSet's pods and ports and set
#   job="resource-tracker", each alert has a severity, a summary and a
#   description;
# - the PrometheusRule's rules with `promtool check rules` and their unit tests
#   (prometheusrule_test.yaml) with `promtool test rules`;
# - every query of the dashboard, parsed by promtool as a recording rule;
# - where kubectl (or kustomize) is here, the bundle as `kubectl apply -k` renders
#   it, with and without the podmonitor component, against the schemas again.
# The virtual environment is made once (target/kv); after that nothing is fetched.
# Exits non-zero when anything does not validate.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
dir=$(cd "${1:-$here}" && pwd)
venv=${KV_VENV:-$root/target/kv}
pin=1.37.0
pyyaml=6.0.4
versions=(1.37.0 1.30.0)

kv=$venv/bin/kubernetes-validate
py=$venv/bin/python
if ! [[ -x $kv ]] || [[ $("$kv" --version 2>/dev/null) != "$pin" ]] \
    || [[ $("$py" -c 'import yaml; print(yaml.__version__)' 2>/dev/null) != "$pyyaml" ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "kubernetes-validate==$pin" "PyYAML==$pyyaml"
fi
command -v promtool >/dev/null || {
    echo "validate.sh: promtool is missing (Debian's prometheus package; scripts/setup.sh installs it)" >&2
    exit 1
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

# kubernetes-validate exits 0 on a kind it has no schema for: that warning fails.
schemas() {
    local out
    for v in "${versions[@]}"; do
        out=$("$kv" --strict -k "$v" "$@" 2>&1) || status=1
        printf '%s\n' "$out"
        if grep -q "Couldn't find schema" <<<"$out"; then
            echo "validate.sh: a kind without a schema above (misspelt, or a custom kind bundle-check.py should take)" >&2
            status=1
        fi
    done
}

"$py" "$here/bundle-check.py" "$dir" "$tmp" || status=1
mapfile -t core <"$tmp/core.list"
if [[ ${#core[@]} -eq 0 ]]; then
    echo "validate.sh: no manifests of core kinds in $dir" >&2
    status=1
else
    schemas "${core[@]}"
fi

promtool check rules "$tmp/rules.yaml" || status=1
for t in "$dir"/*_test.yaml; do
    [[ -e $t ]] || continue
    cp "$t" "$tmp/"
    (cd "$tmp" && promtool test rules "$(basename "$t")") || status=1
done
echo "the dashboard's queries:"
promtool check rules "$tmp/dashboard-rules.yaml" || status=1

if command -v kustomize >/dev/null; then
    render=(kustomize build)
elif command -v kubectl >/dev/null; then
    render=(kubectl kustomize)
else
    render=()
    echo "validate.sh: neither kustomize nor kubectl here: the rendered bundle is not checked"
fi
if [[ ${#render[@]} -gt 0 ]]; then
    cp -r "$dir" "$tmp/with-podmonitor"
    "$py" - "$tmp/with-podmonitor/kustomization.yaml" <<'EOF'
import sys, yaml
p = sys.argv[1]
k = yaml.safe_load(open(p))
k["components"] = ["podmonitor"]
yaml.safe_dump(k, open(p, "w"), sort_keys=False)
EOF
    for k in "$dir" "$tmp/with-podmonitor"; do
        echo "rendered: ${k/#$tmp\//}"
        if "${render[@]}" "$k" >"$tmp/rendered.yaml"; then
            "$py" "$here/bundle-check.py" core "$tmp/rendered.yaml" "$tmp/rendered-core.yaml" || status=1
            schemas "$tmp/rendered-core.yaml"
        else
            status=1
        fi
    done
fi
exit $status
