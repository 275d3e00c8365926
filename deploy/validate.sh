#!/usr/bin/env bash
# Validates every manifest in deploy/ offline against the Kubernetes API schemas that
# kubernetes-validate ships: the newest it knows and 1.30, the oldest that has every
# field the DaemonSet uses (recursiveReadOnly). Strict: an unknown field fails too.
# The virtual environment is made once (target/kv); after that nothing is fetched.
# Exits non-zero when a manifest does not validate.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
venv=${KV_VENV:-$root/target/kv}
pin=1.37.0
versions=(1.37.0 1.30.0)

kv=$venv/bin/kubernetes-validate
if ! [[ -x $kv ]] || [[ $("$kv" --version 2>/dev/null) != "$pin" ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "kubernetes-validate==$pin"
fi

shopt -s nullglob
manifests=("$here"/*.yaml)
[[ ${#manifests[@]} -gt 0 ]] || { echo "validate.sh: no manifests in $here" >&2; exit 1; }

status=0
for v in "${versions[@]}"; do
    "$kv" --strict -k "$v" "${manifests[@]}" || status=1
done
exit $status
