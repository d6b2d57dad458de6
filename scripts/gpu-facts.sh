#!/bin/sh
# Run the facts playbook over a local connection on THIS machine and print its NodeFacts JSON.
#
# Used to validate facts collection on real hardware (e.g. an H200 GPU machine). Needs only
# python3; ansible-core is used from PATH, or installed into a temporary virtualenv when missing.
# Read-only on the machine: it writes nothing outside a temporary directory.
#
#   scripts/gpu-facts.sh            print the facts JSON
#   KEEP=1 scripts/gpu-facts.sh     keep the temporary directory (fetched kubelet files) and say where
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/rollout-gpu-facts.XXXXXX")
[ "${KEEP:-}" = 1 ] || trap 'rm -rf "$work"' EXIT

python=$(command -v python3)
if command -v ansible-playbook >/dev/null 2>&1; then
  playbook=$(command -v ansible-playbook)
elif [ -x "$here/.venv/bin/ansible-playbook" ]; then
  playbook="$here/.venv/bin/ansible-playbook"
  python="$here/.venv/bin/python"
else
  echo "ansible-core not found; installing it into $work/venv" >&2
  "$python" -m venv "$work/venv"
  "$work/venv/bin/pip" install -q "ansible-core>=2.17"
  playbook="$work/venv/bin/ansible-playbook"
  python="$work/venv/bin/python"
fi

cd "$here/playbooks"
ANSIBLE_ROLES_PATH="$here/playbooks/roles" ANSIBLE_GATHERING=explicit ANSIBLE_NOCOLOR=1 \
ANSIBLE_RETRY_FILES_ENABLED=False ANSIBLE_LOCAL_TEMP="$work/tmp" \
  "$playbook" -i localhost, -c local facts.yml \
    -e rollout_hosts=localhost \
    -e "ansible_python_interpreter=$python" \
    -e "rollout_kubelet_facts_dir=$work/facts" >"$work/ansible.log" 2>&1 || {
  cat "$work/ansible.log" >&2
  exit 1
}
cat "$work/facts/localhost.json"
[ "${KEEP:-}" != 1 ] || echo "kept: $work (kubelet files under facts/localhost/)" >&2
