"""What deploy/validate.sh checks beyond the Kubernetes schemas, and what it hands
to kubernetes-validate and promtool. Run by validate.sh with the venv's python
(PyYAML).

    bundle-check.py DIR OUT    check DIR's bundle; write OUT/core.list (the
                               manifests of core kinds), OUT/rules.yaml (the
                               PrometheusRules' spec), OUT/dashboard-rules.yaml
                               (each dashboard query as a recording rule) and
                               OUT/queries.json (every query, where it is)
    bundle-check.py core IN OUT    the core-kind documents of a rendered bundle

Exits 1 after printing every problem found.
"""

import json
import re
import sys
from pathlib import Path

import yaml

# The kinds kubernetes-validate has no schema for: it only warns on them and
# passes, so they are kept from it here and checked below instead. Any other kind
# goes to it, and a warning of a missing schema fails (a misspelt kind or
# apiVersion).
NOT_CORE = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
    ("kustomize.config.k8s.io/v1alpha1", "Component"),
}

# Without the operator's CRD schemas offline, a misspelt field would be dropped
# by the API server without a word: only these fields (the API's, those this
# bundle uses and their neighbours) are let through. Add one after checking it
# in the CRD.
MONITOR_SPEC = {
    "selector", "namespaceSelector", "endpoints", "podMetricsEndpoints", "jobLabel",
    "targetLabels", "podTargetLabels", "sampleLimit", "attachMetadata",
}
ENDPOINT = {
    "port", "targetPort", "path", "scheme", "params", "interval", "scrapeTimeout",
    "honorLabels", "honorTimestamps", "relabelings", "metricRelabelings", "tlsConfig",
    "bearerTokenSecret", "authorization", "basicAuth", "followRedirects",
}
RELABELING = {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}
RULE = {"alert", "record", "expr", "for", "labels", "annotations"}

# Grafana's variables as a query sees them; any other `$name` is a regex value.
GRAFANA_VARS = [
    ("$__rate_interval", "5m"),
    ("${__rate_interval}", "5m"),
    ("$__interval", "1m"),
    ("${__interval}", "1m"),
    ("$__range", "1h"),
    ("${__range}", "1h"),
]

problems = []


def problem(msg):
    problems.append(msg)
    print(f"bundle-check: {msg}", file=sys.stderr)


def load_all(path):
    try:
        return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as e:
        problem(f"{path}: not YAML: {e}")
        return []


def kind_of(doc):
    return (doc.get("apiVersion"), doc.get("kind"))


def check_kustomization(path, dir_of_bundle, manifests_here):
    """Every resource it names exists, and every manifest beside it is named."""
    k = (load_all(path) or [{}])[0]
    base = path.parent
    named = set()
    for r in k.get("resources", []):
        p = (base / r).resolve()
        if p.is_dir():
            if not (p / "kustomization.yaml").is_file():
                problem(f"{path}: resource {r} is a directory without a kustomization.yaml")
        elif p.is_file():
            named.add(p)
        else:
            problem(f"{path}: resource {r} does not exist")
    for c in k.get("components", []):
        if not (base / c / "kustomization.yaml").is_file():
            problem(f"{path}: component {c} has no kustomization.yaml")
    for gen in k.get("configMapGenerator", []):
        for f in gen.get("files", []):
            p = (base / f.split("=", 1)[-1]).resolve()
            if not p.is_file():
                problem(f"{path}: configMapGenerator file {f} does not exist")
            named.add(p)
    for m in manifests_here:
        if m.resolve() not in named:
            problem(f"{path}: {m.relative_to(dir_of_bundle)} is beside it but not in its resources")
    return named


def subset(sel, labels):
    return bool(sel) and all(labels.get(k) == v for k, v in sel.items())


def sets_job(endpoint, where):
    rel = endpoint.get("relabelings") or []
    for r in rel:
        unknown = set(r) - RELABELING
        if unknown:
            problem(f"{where}: relabeling fields {sorted(unknown)} unknown")
    if not any(
        r.get("targetLabel") == "job"
        and r.get("replacement") == "resource-tracker"
        and r.get("action", "replace") == "replace"
        for r in rel
    ):
        problem(f'{where}: no relabeling sets job="resource-tracker"')
    if endpoint.get("honorLabels") is not False:
        problem(f"{where}: honorLabels must be false (a scraped job label would win)")


def check_wiring(docs):
    by_kind = {}
    for path, d in docs:
        by_kind.setdefault(d.get("kind"), []).append((path, d))
    pods = []
    for path, ds in by_kind.get("DaemonSet", []):
        tpl = ds["spec"]["template"]
        ports = {
            p.get("name")
            for c in tpl["spec"]["containers"]
            for p in c.get("ports", [])
        }
        pods.append((ds["metadata"].get("namespace"), tpl["metadata"].get("labels", {}), ports))
    services = []
    for path, svc in by_kind.get("Service", []):
        ns = svc["metadata"].get("namespace")
        sel = svc["spec"].get("selector", {})
        match = [p for p in pods if p[0] == ns and subset(sel, p[1])]
        if not match:
            problem(f"{path}: Service {svc['metadata']['name']} selects no DaemonSet's pods")
        for port in svc["spec"].get("ports", []):
            t = port.get("targetPort")
            if isinstance(t, str) and not any(t in p[2] for p in match):
                problem(f"{path}: Service port {port.get('name')} targets {t}, no container port of that name")
        services.append((ns, svc["metadata"].get("labels", {}), {p.get("name") for p in svc["spec"].get("ports", [])}))
    for kind, field, targets in (
        ("ServiceMonitor", "endpoints", services),
        ("PodMonitor", "podMetricsEndpoints", pods),
    ):
        for path, m in by_kind.get(kind, []):
            where = f"{path}: {kind} {m['metadata']['name']}"
            spec = m.get("spec", {})
            unknown = set(spec) - MONITOR_SPEC
            if unknown:
                problem(f"{where}: spec fields {sorted(unknown)} unknown")
            names = (spec.get("namespaceSelector") or {}).get("matchNames") or [m["metadata"].get("namespace")]
            sel = (spec.get("selector") or {}).get("matchLabels", {})
            match = [t for t in targets if t[0] in names and subset(sel, t[1])]
            if not match:
                problem(f"{where}: selects nothing in this bundle")
            if not spec.get(field):
                problem(f"{where}: no {field}")
            for e in spec.get(field) or []:
                unknown = set(e) - ENDPOINT
                if unknown:
                    problem(f"{where}: endpoint fields {sorted(unknown)} unknown")
                if not any(e.get("port") in t[2] for t in match):
                    problem(f"{where}: port {e.get('port')} is not a port of what it selects")
                sets_job(e, where)


def rules_of(docs):
    groups = []
    for path, d in docs:
        if d.get("kind") != "PrometheusRule":
            continue
        spec = d.get("spec") or {}
        if set(spec) != {"groups"}:
            problem(f"{path}: a PrometheusRule's spec has groups and nothing else")
        for g in spec.get("groups") or []:
            for r in g.get("rules") or []:
                name = r.get("alert") or r.get("record")
                unknown = set(r) - RULE
                if unknown:
                    problem(f"{path}: rule {name}: fields {sorted(unknown)} unknown")
                if "alert" in r:
                    if not (r.get("labels") or {}).get("severity"):
                        problem(f"{path}: alert {name} has no severity label")
                    for a in ("summary", "description"):
                        if not (r.get("annotations") or {}).get(a):
                            problem(f"{path}: alert {name} has no {a} annotation")
            groups.append(g)
    return {"groups": groups}


def dashboard_exprs(dash):
    """Every query of a Grafana dashboard model, named for where it is: each
    panel target's `expr` (panel_ID_REFID) and each query variable's selector
    (variable_NAME)."""

    def panels(ps):
        for p in ps or []:
            yield p
            yield from panels(p.get("panels"))

    for p in panels(dash.get("panels")):
        for t in p.get("targets") or []:
            if "expr" in t:
                yield f"panel_{p.get('id')}_{t.get('refId', '')}", t["expr"]
    for var in (dash.get("templating") or {}).get("list", []):
        if var.get("type") != "query":
            continue
        q = var.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if var.get("definition", q) != q:
            problem(f"variable {var.get('name')}: its definition is not its query")
        m = re.fullmatch(r"\s*label_values\((.*)\)\s*", q or "", re.S)
        if m:
            # label_values(SELECTOR, LABEL); label_values(LABEL) has none.
            parts = m.group(1).rsplit(",", 1)
            q = parts[0] if len(parts) == 2 else None
        if q:
            yield f"variable_{var.get('name')}", q


def as_promql(expr):
    for var, value in GRAFANA_VARS:
        expr = expr.replace(var, value)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def main_bundle(bundle, out):
    bundle = Path(bundle).resolve()
    out = Path(out)
    yamls = sorted(p for p in bundle.rglob("*.yaml"))
    kustomizations = [p for p in yamls if p.name == "kustomization.yaml"]
    if bundle / "kustomization.yaml" not in kustomizations:
        problem(f"{bundle}: no kustomization.yaml")
    manifests = [p for p in yamls if p.name != "kustomization.yaml" and not p.name.endswith("_test.yaml")]
    named = set()
    for k in kustomizations:
        named |= check_kustomization(k, bundle, [m for m in manifests if m.parent == k.parent])
    for m in manifests:
        if m.parent not in {k.parent for k in kustomizations}:
            problem(f"{m.relative_to(bundle)}: in no kustomization's directory")
    core, docs = [], []
    for p in manifests:
        ds = load_all(p)
        kinds = {kind_of(d) for d in ds}
        if not ds or any(None in k for k in kinds):
            problem(f"{p.relative_to(bundle)}: a document without apiVersion and kind")
            continue
        if kinds <= NOT_CORE:
            print(f"bundle-check: {p.relative_to(bundle)}: {', '.join(sorted(k for _, k in kinds))} (no schema: checked here)")
        elif kinds & NOT_CORE:
            problem(f"{p.relative_to(bundle)}: core and custom kinds in one file")
        else:
            core.append(str(p))
        docs += [(p.relative_to(bundle), d) for d in ds]
    check_wiring(docs)
    (out / "core.list").write_text("".join(f"{p}\n" for p in core))
    rules = rules_of(docs)
    (out / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    exprs = []
    for p in sorted(named):
        if p.suffix == ".json":
            try:
                exprs += list(dashboard_exprs(json.loads(p.read_text())))
            except json.JSONDecodeError as e:
                problem(f"{p}: not JSON: {e}")
    if any(p.suffix == ".json" for p in named) and not exprs:
        problem("the dashboards have no query")
    records = [{"record": f"dashboard:{where}", "expr": as_promql(e)} for where, e in exprs]
    queries = [
        {"where": f"prometheusrule.yaml: {r.get('alert') or r.get('record')}", "expr": r.get("expr", "")}
        for g in rules["groups"]
        for r in g.get("rules") or []
    ] + [{"where": f"dashboard.json: {where}", "expr": as_promql(e)} for where, e in exprs]
    (out / "queries.json").write_text(json.dumps(queries, indent=1))
    (out / "dashboard-rules.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}, sort_keys=False)
    )
    n = sum(len(g.get("rules") or []) for g in rules["groups"])
    print(f"bundle-check: {len(core)} core manifests, {n} rules, {len(exprs)} dashboard queries")


def main_core(rendered, out):
    docs = load_all(Path(rendered))
    core = [d for d in docs if kind_of(d) not in NOT_CORE]
    kinds = [d.get("kind") for d in docs]
    if "ServiceMonitor" in kinds and "PodMonitor" in kinds:
        problem(f"{rendered}: a ServiceMonitor and a PodMonitor: each agent would be scraped twice")
    Path(out).write_text(yaml.safe_dump_all(core, sort_keys=False))
    print(f"bundle-check: {rendered}: {len(docs)} resources, {len(core)} of core kinds")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "core":
        main_core(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3:
        main_bundle(sys.argv[1], sys.argv[2])
    else:
        sys.exit(__doc__)
    sys.exit(1 if problems else 0)
