#!/usr/bin/python
# ruff: noqa: E402, UP031  (Ansible module layout; runs on the node's own Python)
"""The whole node-side step of an apply or a restore, in one module call (one SSH round trip).

Why one module: every Ansible task is a round trip and a Python start on the node; the apply used
to be a dozen tasks per node. This module does, in order, on the node:

apply:   compare-and-swap check of every file to be written (its sha256 must still be the one
         preflight read, or it must still be absent; our own rendered bytes are also accepted, so a
         resumed apply is idempotent) -> backup of the bytes actually there (first backup of a
         change wins; its digest must equal the expected one) -> atomic writes (temporary file in
         the same directory, fsync, owner and mode, rename, fsync of the directory) ->
         daemon-reload -> stop -> checkpoint reset -> start -> /healthz wait -> result.
restore: compare-and-swap check (each file must hold what our apply wrote, or already the
         original; ``force`` skips the check) -> atomic writes of the original bytes (sent by
         the controller, or, when it has none, this node's own backup checked against the
         journal's sha256), removal of
         the files and directories the change created -> daemon-reload -> stop -> checkpoint
         reset -> start -> /healthz wait -> result.

On a compare-and-swap mismatch nothing is written and the result says ``refused: true`` with every
mismatch (path, expected, found). Every other failure says which step failed and whether any file
was written (``written``). The content is never computed here (design.md, convention 10).
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: rollout_kubelet_step
short_description: Apply or restore kubelet files with a compare-and-swap check, restart, healthz
description:
  - One call does the node-side work of an apply or a restore (see the module docstring).
options:
  action:
    description: C(apply), C(restore), or C(check) (read-only; C(payload.paths) -> their sha256).
    type: str
    required: true
    choices: [apply, restore, check]
  payload:
    description: The per-host payload the rollout tool wrote (rollout/ansible/payloads.py).
    type: dict
    required: true
  force:
    description: Restore only. Overwrite files that changed after our write.
    type: bool
    default: false
  daemon_reload:
    description: Run C(systemctl daemon-reload) before the start when a file changed.
    type: bool
    default: true
  healthz_retries:
    description: How many times to poll /healthz after the start.
    type: int
    default: 240
  healthz_delay:
    description: Seconds between two polls.
    type: float
    default: 0.25
  healthz_timeout:
    description: Timeout of one probe, seconds.
    type: float
    default: 3
  systemctl_timeout:
    description: Timeout of one systemctl command, seconds.
    type: float
    default: 90
author: rollout
"""

import base64
import contextlib
import grp
import hashlib
import json
import os
import pwd
import re
import shlex
import shutil
import ssl
import subprocess
import tempfile
import time
from urllib.error import URLError
from urllib.request import urlopen

try:
    from ansible.module_utils.basic import AnsibleModule
except ImportError:  # sent over plain ssh by the rollout tool (rollout/ansible/direct.py)
    AnsibleModule = None

ABSENT = "absent"


class StepError(Exception):
    """A step failed; ``step`` names it."""

    def __init__(self, step, msg):
        super().__init__(msg)
        self.step = step


class Refused(Exception):
    """The node's files are not what the controller expects; nothing was written."""

    def __init__(self, mismatches):
        super().__init__("files changed on the node")
        self.mismatches = mismatches


def digest(path):
    """sha256 of a regular file, ``absent`` when there is none. Refuses anything else."""
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isfile(path)):
        raise StepError("check", "%s is not a regular file; refusing to replace it" % path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return ABSENT, None
    return hashlib.sha256(data).hexdigest(), data


def check(items):
    """Compare-and-swap check. ``items``: ``[(path, allowed digests)]``. Returns the current
    digest and bytes of every path; raises Refused listing every mismatch (pure reads)."""
    current, mismatches = {}, []
    for path, allowed in items:
        found, data = digest(path)
        current[path] = (found, data)
        if found not in allowed:
            mismatches.append({"path": path, "expected": allowed[0], "found": found})
    if mismatches:
        raise Refused(mismatches)
    return current


def _name(lookup, ident):
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)


def _uid(name):
    return int(name) if str(name).isdigit() else pwd.getpwnam(name).pw_uid


def _gid(name):
    return int(name) if str(name).isdigit() else grp.getgrnam(name).gr_gid


def meta(path):
    st = os.stat(path)
    return (
        "%04o" % (st.st_mode & 0o7777),
        _name(pwd.getpwuid, st.st_uid),
        _name(grp.getgrgid, st.st_gid),
    )


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def missing_parents(path):
    missing = []
    parent = os.path.dirname(path)
    while parent and parent != "/" and not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    return missing


def write_atomically(path, data, mode, owner, group, validate=None, run=None):
    """Temporary file in the same directory, fsync, owner and mode, rename, fsync the directory:
    a crash leaves the old bytes or the new ones, never a torn file."""
    parent = os.path.dirname(path)
    for d in reversed(missing_parents(path)):
        os.mkdir(d, 0o755)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=".rollout-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if os.geteuid() == 0:
            os.chown(tmp, _uid(owner), _gid(group))
        os.chmod(tmp, int(mode, 8))
        if validate:
            rc, out = run(shlex.split(validate.replace("%s", shlex.quote(tmp))))
            if rc != 0:
                raise StepError("write", "validation of %s failed: %s" % (path, out.strip()))
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(parent)


def write_json(path, payload):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)
    os.rename(tmp, path)
    fsync_dir(os.path.dirname(path))


def backup(backup_dir, change_id, files, current):
    """Record the bytes actually there before the first write (first backup of a change wins).

    ``files``: payload entries; ``current``: path -> (digest, bytes) read by :func:`check`. A
    recorded digest must equal the expected one (what the journal holds); a path already ours
    (a resumed apply) with no backup yet cannot be backed up and is refused.
    """
    manifest_path = os.path.join(backup_dir, "manifest.json")
    manifest = {"changeId": change_id, "files": []}
    if os.path.exists(manifest_path):
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    known = {e["path"]: e for e in manifest["files"]}
    added = False
    for item in files:
        path, expect = item["path"], item["expect"]
        entry = known.get(path)
        if entry is not None:
            recorded = entry["sha256"] if entry["existed"] else ABSENT
            if recorded != expect:
                raise StepError(
                    "backup",
                    "the node's backup of %s has %s, the journal %s" % (path, recorded, expect),
                )
            continue
        found, data = current[path]
        if found != expect:
            raise StepError(
                "backup",
                "%s holds %s, not the expected %s, and no backup of it exists"
                % (path, found, expect),
            )
        if data is None:
            entry = {
                "path": path,
                "existed": False,
                "sha256": None,
                "mode": None,
                "owner": None,
                "group": None,
                "content_b64": None,
                "missingParents": missing_parents(path),
            }
        else:
            mode, owner, group = meta(path)
            copy = os.path.join(backup_dir, "files", path.lstrip("/"))
            os.makedirs(os.path.dirname(copy), mode=0o700, exist_ok=True)
            with open(copy, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            entry = {
                "path": path,
                "existed": True,
                "sha256": found,
                "mode": mode,
                "owner": owner,
                "group": group,
                "content_b64": base64.b64encode(data).decode("ascii"),
                "missingParents": [],
            }
        manifest["files"].append(entry)
        added = True
    if added:
        os.makedirs(backup_dir, mode=0o700, exist_ok=True)
        write_json(manifest_path, manifest)
    return manifest


def decode(item):
    data = base64.b64decode(item["content_b64"])
    if hashlib.sha256(data).hexdigest() != item["sha256"]:
        raise StepError("check", "payload for %s: content does not match its sha256" % item["path"])
    return data


def healthz(url, ca_path, retries, delay, timeout):
    """Poll until the body is ``ok``; returns (body, seconds waited)."""
    ctx = ssl.create_default_context(cafile=ca_path) if ca_path else None
    started = time.monotonic()
    last = "no answer"
    for attempt in range(max(1, retries)):
        try:
            with urlopen(url, timeout=timeout, context=ctx) as r:
                body = r.read().decode("utf-8", "replace").strip()
                if r.status == 200 and body == "ok":
                    return body, time.monotonic() - started
                last = "HTTP %d %r" % (r.status, body[:200])
        except (URLError, OSError, ValueError) as e:
            last = str(getattr(e, "reason", e))
        if attempt + 1 < retries:
            time.sleep(delay)
    raise StepError(
        "healthz",
        "the kubelet's healthz endpoint %s did not answer ok after %d tries (%s)"
        % (url, retries, last),
    )


# a klog error line ("E1201 08:12:00.123456    1234 run.go:72] ..."), alone or after a journal
# prefix ("Dec 01 08:12:00 host kubelet[1234]: E1201 ...")
KLOG_ERROR = re.compile(r"(?:^|\s)E\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\]]*\] (.*)$")


def last_error(log_text):
    """The kubelet's last logged error (its klog ``E`` line, header stripped), or ``None``."""
    found = None
    for line in log_text.splitlines():
        m = KLOG_ERROR.search(line.rstrip())
        if m:
            found = m.group(1).strip()
    return found


class Node:
    """The systemctl and healthz side, with timings."""

    def __init__(self, module, params):
        self.module = module
        self.p = params
        self.timings = {}
        self.wrote = False  # a file on the node was changed by this call

    def run(self, argv):
        try:
            r = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=self.p["systemctl_timeout"],
                check=False,
            )
        except subprocess.TimeoutExpired:
            return 124, "%s timed out after %ss" % (" ".join(argv), self.p["systemctl_timeout"])
        return r.returncode, (r.stderr or r.stdout)

    def systemctl(self, step, *args):
        if self.module is not None:
            exe = self.module.get_bin_path("systemctl", required=True)
        else:
            exe = shutil.which("systemctl") or "/usr/bin/systemctl"
        rc, out = self.run([exe, *args])
        if rc != 0:
            raise StepError(
                step, "systemctl %s failed (rc %d): %s" % (" ".join(args), rc, out.strip())
            )

    def timed(self, name, fn, *args):
        t = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.timings[name] = round(time.monotonic() - t, 3)

    def restart(self, payload, reload_units):
        """daemon-reload (when asked), stop, checkpoint reset, start, /healthz wait."""
        svc = payload["service"]
        if reload_units and self.p["daemon_reload"]:
            self.timed("daemonReload", self.systemctl, "daemon-reload", "daemon-reload")
        self.timed("stop", self.systemctl, "stop", "stop", svc)
        removed = []
        for path in payload.get("checkpoint_reset") or []:
            if os.path.lexists(path):
                os.unlink(path)
                removed.append(path)
        self.timed("start", self.systemctl, "start", "start", svc)
        try:
            body, _ = self.timed(
                "healthz",
                healthz,
                payload["healthz_url"],
                payload.get("healthz_ca_path"),
                self.p["healthz_retries"],
                self.p["healthz_delay"],
                self.p["healthz_timeout"],
            )
        except StepError as e:
            said = self.kubelet_said(svc)
            if said:  # why it did not come up, in the kubelet's own words
                raise StepError(e.step, "%s; the kubelet logged: %s" % (e, said)) from e
            raise
        return removed, body

    def kubelet_said(self, svc):
        """The last error the unit logged (``systemctl status``: the journal's tail), or None."""
        if self.module is not None:
            exe = self.module.get_bin_path("systemctl")
        else:
            exe = shutil.which("systemctl")
        if not exe:
            return None
        try:
            r = subprocess.run(
                [exe, "status", "--no-pager", "--full", "--lines=200", svc],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return last_error(r.stdout or "")


def apply(node, payload):
    files = payload["files"]
    for item in files:
        if item.get("expect") is None:
            raise StepError(
                "check", "payload for %s names no expected sha256 (or absent)" % item["path"]
            )
    contents = {item["path"]: decode(item) for item in files}
    current = node.timed("check", check, [(i["path"], [i["expect"], i["sha256"]]) for i in files])
    manifest = node.timed(
        "backup", backup, payload["backup_dir"], payload["change_id"], files, current
    )
    state = {"manifest": manifest, "written": []}
    t = time.monotonic()
    for item in files:
        if current[item["path"]][0] == item["sha256"]:
            continue  # already our bytes (a resumed apply)
        node.wrote = True
        write_atomically(
            item["path"],
            contents[item["path"]],
            item["mode"],
            item["owner"],
            item["group"],
            item.get("validate"),
            node.run,
        )
        state["written"].append(item["path"])
    node.timings["write"] = round(time.monotonic() - t, 3)
    removed, body = node.restart(payload, bool(state["written"]))
    created = [e["path"] for e in manifest["files"] if not e["existed"]]
    pruned = prune_backups(payload["backup_dir"], payload.get("keep_backups", KEEP_BACKUPS))
    return {
        "changed": True,
        "changedFiles": state["written"],
        "createdFiles": created,
        "checkpointsRemoved": removed,
        "healthz": body,
        "manifest": manifest,
        "backupDir": payload["backup_dir"],
        "prunedBackups": pruned,
    }


KEEP_BACKUPS = 10


def prune_backups(backup_dir, keep):
    """After an apply that succeeded: keep this change's backup and the ``keep - 1`` newest
    others beside it (by change id, which sorts by start time); remove the older ones. A node
    then holds the originals of its last ``keep`` changes, whatever its disk."""
    root, current = os.path.split(os.path.normpath(backup_dir))
    try:
        others = sorted(
            d
            for d in os.listdir(root)
            if d != current and os.path.isfile(os.path.join(root, d, "manifest.json"))
        )
    except OSError:
        return []
    old = others[: max(0, len(others) - (keep - 1))] if keep > 0 else []
    for d in old:
        shutil.rmtree(os.path.join(root, d), ignore_errors=True)
    return old


def node_copy(backup_dir, item):
    """The original bytes of ``item`` from this node's own backup (the controller has none):
    they must be in the manifest the apply wrote and match the journal's sha256."""
    manifest_path = os.path.join(backup_dir or "", "manifest.json")
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise StepError("check", "no node backup of %s: %s" % (item["path"], e)) from e
    for entry in manifest.get("files", []):
        if entry.get("path") == item["path"] and entry.get("existed"):
            data = base64.b64decode(entry.get("content_b64") or "")
            if hashlib.sha256(data).hexdigest() != item["sha256"]:
                raise StepError(
                    "check",
                    "the node's backup of %s is not the journal's %s"
                    % (item["path"], item["sha256"]),
                )
            return data
    raise StepError("check", "no node backup of %s in %s" % (item["path"], manifest_path))


def restore(node, payload, force):
    items = payload["restore"]
    contents = {}
    for item in items:
        if item.get("content_b64") is not None:
            contents[item["path"]] = decode(item)
        elif item.get("from_node_backup"):
            contents[item["path"]] = node_copy(payload.get("backup_dir"), item)
    original = {i["path"]: (i["sha256"] if i["path"] in contents else ABSENT) for i in items}
    allowed = [(i["path"], [*(i.get("current") or []), original[i["path"]]]) for i in items]
    if force:
        current = {i["path"]: digest(i["path"]) for i in items}
    else:
        current = node.timed("check", check, allowed)
    written, removed_files = [], []
    t = time.monotonic()
    for item in items:
        path = item["path"]
        if current[path][0] == original[path]:
            continue  # already the original bytes
        node.wrote = True
        if path in contents:
            write_atomically(
                path,
                contents[path],
                item["mode"] or "0644",
                item["owner"] or "root",
                item["group"] or "root",
                None,
                node.run,
            )
            written.append(path)
        else:
            os.unlink(path)
            fsync_dir(os.path.dirname(path))
            removed_files.append(path)
    for d in payload.get("remove_dirs") or []:
        with contextlib.suppress(OSError):  # not empty or already gone: leave it
            os.rmdir(d)
    node.timings["write"] = round(time.monotonic() - t, 3)
    removed, body = node.restart(payload, bool(written or removed_files))
    return {
        "changed": True,
        "changedFiles": written,
        "removedFiles": removed_files,
        "checkpointsRemoved": removed,
        "healthz": body,
        "forced": bool(force),
    }


def run_step(node, action, payload, force=False):
    """Run one step; returns the module result (never raises for a node-side failure)."""
    base = {"rollout_step": action, "changeId": payload.get("change_id"), "action": action}
    started = time.monotonic()
    if action == "check":  # read-only: the current sha256 (or absent) of each path
        try:
            found = {p: digest(p)[0] for p in payload.get("paths") or []}
        except StepError as e:
            return dict(base, failed=True, status="failed", msg=str(e))
        return dict(base, changed=False, status="ok", digests=found)
    try:
        out = apply(node, payload) if action == "apply" else restore(node, payload, force)
        out.update(base, status="ok", written=True, refused=False)
    except Refused as e:
        lines = [
            "%s: expected %s, found %s" % (m["path"], m["expected"], m["found"])
            for m in e.mismatches
        ]
        what = "our last write" if action == "restore" else "what preflight read"
        out = dict(
            base,
            failed=True,
            status="refused",
            refused=True,
            written=False,
            mismatches=e.mismatches,
            failedStep="check",
            msg="refused: file(s) changed on the node since %s; nothing written: %s"
            % (what, "; ".join(lines)),
        )
    except (StepError, OSError, KeyError, ValueError) as e:
        step = getattr(e, "step", "write")
        written = node.wrote
        out = dict(
            base,
            failed=True,
            status="failed",
            refused=False,
            written=written,
            failedStep=step,
            msg="%s failed at %s: %s" % (action, step, e),
        )
    node.timings["total"] = round(time.monotonic() - started, 3)
    out["timings"] = dict(node.timings)
    return out


# The node step's defaults, the one set: the module's options (their Ansible type is the value's
# type) and the plain-ssh path use them, the rollout tool reads them from this file
# (rollout.ansible.direct.step_defaults), and tests/unit/test_node_step_defaults.py keeps the
# role's defaults/main.yml and DOCUMENTATION above equal to them. A literal: read without running.
DEFAULTS = {
    "force": False,
    "daemon_reload": True,
    "healthz_retries": 240,
    "healthz_delay": 0.25,
    "healthz_timeout": 3.0,
    "systemctl_timeout": 90.0,
}


def direct(args):
    """Entry point when the rollout tool runs this file over plain ssh (no Ansible): the same
    arguments as the module, the same result."""
    params = dict(DEFAULTS, **args)
    return run_step(Node(None, params), params["action"], params["payload"], params["force"])


def main():
    module = AnsibleModule(
        argument_spec={
            "action": {
                "type": "str",
                "required": True,
                "choices": ["apply", "restore", "check"],
            },
            "payload": {"type": "dict", "required": True},
            **{k: {"type": type(v).__name__, "default": v} for k, v in DEFAULTS.items()},
        },
        supports_check_mode=False,
    )
    p = module.params
    out = run_step(Node(module, p), p["action"], p["payload"], p["force"])
    if out.get("failed"):
        module.fail_json(**out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
