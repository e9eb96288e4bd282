#!/usr/bin/env python3
"""check.py [--script analyze|merge | --shards]: checks docker/k8s/*.yaml without a cluster.

No kubectl and no API server here, so this checks what an Indexed Job needs by reading the
manifests as YAML (PyYAML): batch/v1 Job, completionMode Indexed, completions = MIMIC_SHARDS,
a restart policy a Job accepts, the shard taken from JOB_COMPLETION_INDEX, every volume mount
backed by a volume, the captures mounted read-only, and the merge Job's MIMIC_SHARDS and
MIMIC_RUN equal to the shard Job's. Exit 0 when all hold, 1 when one does not (each problem
printed), 2 when a file cannot be read.

--script analyze|merge prints that Job's container script (docker/lan-test.sh runs it in
containers of the image, JOB_COMPLETION_INDEX set as Kubernetes sets it); --shards prints N.
"""
import os
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name):
    path = os.path.join(HERE, name)
    try:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        print(f"check.py: {path}: {e}", file=sys.stderr)
        sys.exit(2)
    if len(docs) != 1:
        print(f"check.py: {path}: expected one document, found {len(docs)}", file=sys.stderr)
        sys.exit(2)
    return path, docs[0]


def container(job):
    return job["spec"]["template"]["spec"]["containers"][0]


def env(job):
    return {e["name"]: e.get("value") for e in container(job).get("env", [])}


def script(job):
    c = container(job)
    return (c.get("args") or [""])[-1]


def check_job(path, job, problems, indexed):
    def need(cond, what):
        if not cond:
            problems.append(f"{os.path.basename(path)}: {what}")
    need(job.get("apiVersion") == "batch/v1", "apiVersion must be batch/v1")
    need(job.get("kind") == "Job", "kind must be Job")
    need(bool(job.get("metadata", {}).get("name")), "metadata.name is missing")
    spec = job.get("spec", {})
    pod = spec.get("template", {}).get("spec", {})
    need(pod.get("restartPolicy") in ("Never", "OnFailure"), "restartPolicy must be Never or OnFailure")
    cs = pod.get("containers", [])
    need(len(cs) == 1, "one container expected")
    if not cs:
        return
    c = cs[0]
    need(bool(c.get("image")), "the container has no image")
    need(bool(c.get("command")) and bool(c.get("args")), "the container needs command and args")
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        need(m["name"] in vols, f"volumeMount {m['name']} has no volume")
    e = env(job)
    need(bool(e.get("MIMIC_RUN")), "env MIMIC_RUN is missing")
    need(str(e.get("MIMIC_SHARDS", "")).isdigit() and int(e["MIMIC_SHARDS"]) >= 1, "env MIMIC_SHARDS must be a positive number")
    if indexed:
        need(spec.get("completionMode") == "Indexed", "completionMode must be Indexed")
        n = spec.get("completions")
        need(isinstance(n, int) and n >= 1, "completions must be a positive number")
        need(str(n) == str(e.get("MIMIC_SHARDS")), f"completions ({n}) and MIMIC_SHARDS ({e.get('MIMIC_SHARDS')}) differ")
        p = spec.get("parallelism", 1)
        need(isinstance(p, int) and 1 <= p, "parallelism must be a positive number")
        s = script(job)
        need("JOB_COMPLETION_INDEX" in s and "--shard" in s, "the script must take its shard from JOB_COMPLETION_INDEX")
        caps = [m for m in c.get("volumeMounts", []) if m.get("mountPath") == "/captures"]
        need(len(caps) == 1 and caps[0].get("readOnly") is True, "the captures must be mounted read-only at /captures")
        if caps and caps[0]["name"] in vols:
            pvc = vols[caps[0]["name"]].get("persistentVolumeClaim", {})
            need(pvc.get("readOnly") is True, "the captures' claim must be read-only")
    else:
        need("mimic merge" in script(job), "the merge Job must run mimic merge")


def main():
    apath, analyze = load("analyze-shards.yaml")
    mpath, merge = load("merge-shards.yaml")
    if sys.argv[1:] == ["--shards"]:
        print(analyze["spec"]["completions"])
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--script":
        print(script({"analyze": analyze, "merge": merge}[sys.argv[2]]))
        return
    if sys.argv[1:]:
        sys.exit(__doc__)
    problems = []
    check_job(apath, analyze, problems, True)
    check_job(mpath, merge, problems, False)
    for k in ("MIMIC_SHARDS", "MIMIC_RUN"):
        if env(analyze).get(k) != env(merge).get(k):
            problems.append(f"{k} differs between the two Jobs ({env(analyze).get(k)} vs {env(merge).get(k)})")
    for p in problems:
        print(f"check.py: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"docker/k8s: an Indexed Job of {analyze['spec']['completions']} shards and its merge: well-formed (no cluster here: kubectl not run)")


if __name__ == "__main__":
    main()
