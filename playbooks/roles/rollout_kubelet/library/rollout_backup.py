#!/usr/bin/python
# ruff: noqa: E402, UP031  (Ansible module layout; runs on the node's own Python)
"""Back up the node files a change will touch, once per change, before anything is written.

Why a module: the backup must be taken in one step, before the first write, and must never be
overwritten by a second run of the same change (a resumed apply would otherwise "back up" the
half-applied state and lose the real last-known-good files). The manifest is keyed by the change
id's backup directory: if it exists, it is returned as is, and only paths it does not know yet are
added. File bytes are returned base64-encoded so the controller keeps an exact copy.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: rollout_backup
short_description: Record and copy the files a kubelet change will touch
description:
  - For each path, records whether it existed, its sha256, mode, owner and group, copies it to
    C(backup_dir)/files/<path>, and writes C(backup_dir)/manifest.json atomically. An existing
    manifest is kept (first backup wins).
options:
  paths:
    description: Node paths that will be created or modified.
    type: list
    elements: str
    required: true
  backup_dir:
    description: Node directory for this change's backup.
    type: path
    required: true
  change_id:
    description: The change id, recorded in the manifest.
    type: str
    required: true
author: rollout
"""

import base64
import grp
import hashlib
import json
import os
import pwd
import shutil

from ansible.module_utils.basic import AnsibleModule


def _name(lookup, ident):
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)


def _missing_parents(path):
    missing = []
    parent = os.path.dirname(path)
    while parent and parent != "/" and not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    return missing


def record(path, backup_dir):
    if os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)):
        raise ValueError("%s is not a regular file; refusing to replace it" % path)
    if not os.path.exists(path):
        return {
            "path": path,
            "existed": False,
            "sha256": None,
            "mode": None,
            "owner": None,
            "group": None,
            "content_b64": None,
            "missingParents": _missing_parents(path),
        }
    with open(path, "rb") as f:
        data = f.read()
    st = os.stat(path)
    copy = os.path.join(backup_dir, "files", path.lstrip("/"))
    os.makedirs(os.path.dirname(copy), mode=0o700, exist_ok=True)
    shutil.copy2(path, copy)
    os.chown(copy, st.st_uid, st.st_gid)
    return {
        "path": path,
        "existed": True,
        "sha256": hashlib.sha256(data).hexdigest(),
        "mode": "%04o" % (st.st_mode & 0o7777),
        "owner": _name(pwd.getpwuid, st.st_uid),
        "group": _name(grp.getgrgid, st.st_gid),
        "content_b64": base64.b64encode(data).decode("ascii"),
        "missingParents": [],
    }


def write_atomically(path, payload):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)
    os.rename(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main():
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "str", "required": True},
            "backup_dir": {"type": "path", "required": True},
            "change_id": {"type": "str", "required": True},
        },
        supports_check_mode=False,
    )
    backup_dir = module.params["backup_dir"]
    manifest_path = os.path.join(backup_dir, "manifest.json")
    manifest = {"changeId": module.params["change_id"], "files": []}
    changed = False
    try:
        if os.path.exists(manifest_path):
            with open(manifest_path, encoding="utf-8") as f:
                manifest = json.load(f)
        known = {entry["path"] for entry in manifest["files"]}
        new = [p for p in module.params["paths"] if p not in known]
        if new:
            os.makedirs(backup_dir, mode=0o700, exist_ok=True)
            for path in new:
                manifest["files"].append(record(path, backup_dir))
            write_atomically(manifest_path, manifest)
            changed = True
    except (OSError, ValueError) as e:
        module.fail_json(msg="backup to %s failed: %s" % (backup_dir, e))
    module.exit_json(changed=changed, manifest=manifest, manifest_path=manifest_path)


if __name__ == "__main__":
    main()
