"""The stand-in ``nvidia-smi`` of a real node's fake driver root.

A CDI spec mounts the driver's ``nvidia-smi`` into the container, as on a GPU
node; there is no GPU here, so the driver root's ``nvidia-smi`` is this POSIX
shell script instead (it runs with the image's ``/bin/sh``). Like the real one
it reports only what the container can reach: a GPU is listed when its
``/dev/nvidia<minor>`` is a character device in the container, a MIG device
when its compute instance's ``/dev/nvidia-caps/nvidia-cap<N>`` is too. The
table of GPUs (minor, product name, UUID, memory, PCI address) and MIG devices
is the simulated node's, written in when the driver root is built.

Supported: ``-L`` (``--list-gpus``), ``--query-gpu=<fields> --format=csv[,noheader]``
with the fields ``index``, ``name``, ``uuid``, ``memory.total``, ``pci.bus_id``,
and no argument (the list). Anything else exits 2 naming the argument; no
visible GPU prints "No devices were found" and exits 6, as nvidia-smi does.
"""

from __future__ import annotations

from services.discovery.models import get_model
from services.local.driverroot import DriverRoot

HEADER = """#!/bin/sh
# Stand-in nvidia-smi of a gpudra simulated node (services/local/nvidiasmi.py):
# lists the GPUs and MIG devices whose device nodes this container can see.
table() {
cat <<'EOF'
"""

BODY = r"""EOF
}
visible_gpus() {
    table | while IFS='|' read -r kind minor name uuid mem bus; do
        [ "$kind" = gpu ] && [ -c "/dev/nvidia$minor" ] && echo "$minor|$name|$uuid|$mem|$bus"
    done
}
none() {
    [ -n "$(visible_gpus)" ] || { echo "No devices were found"; exit 6; }
}
list() {
    none
    index=0
    visible_gpus | while IFS='|' read -r minor name uuid mem bus; do
        echo "GPU $index: $name (UUID: $uuid)"
        mig=0
        table | while IFS='|' read -r kind parent cap profile miguuid rest; do
            [ "$kind" = mig ] && [ "$parent" = "$minor" ] || continue
            if [ -c "/dev/nvidia-caps/nvidia-cap$cap" ]; then
                echo "  MIG $profile Device $mig: (UUID: $miguuid)"
                mig=$((mig + 1))
            fi
        done
        index=$((index + 1))
    done
}
query() {
    fields=$1
    for field in $(echo "$fields" | tr ',' ' '); do
        case "$field" in
        index | name | uuid | memory.total | pci.bus_id) ;;
        *) echo "Field \"$field\" is not a valid field to query." >&2; exit 2 ;;
        esac
    done
    none
    [ "$2" = 1 ] && echo "$fields" | sed 's/memory.total/memory.total [MiB]/; s/,/, /g'
    index=0
    visible_gpus | while IFS='|' read -r minor name uuid mem bus; do
        out=""
        for field in $(echo "$fields" | tr ',' ' '); do
            case "$field" in
            index) value=$index ;;
            name) value=$name ;;
            uuid) value=$uuid ;;
            memory.total) value="$mem MiB" ;;
            pci.bus_id) value=$bus ;;
            esac
            out="${out:+$out, }$value"
        done
        echo "$out"
        index=$((index + 1))
    done
}
fields="" format="" listing=0
for arg in "$@"; do
    case "$arg" in
    -L | --list-gpus) listing=1 ;;
    --query-gpu=*) fields=${arg#--query-gpu=} ;;
    --format=*) format=${arg#--format=} ;;
    *) echo "stand-in nvidia-smi: unsupported argument: $arg" >&2; exit 2 ;;
    esac
done
if [ -n "$fields" ]; then
    case "$format" in
    csv) query "$fields" 1 ;;
    csv,noheader) query "$fields" 0 ;;
    *) echo "stand-in nvidia-smi: --query-gpu needs --format=csv or csv,noheader" >&2; exit 2 ;;
    esac
else
    list
fi
"""


def script(root: DriverRoot) -> str:
    """The script for the GPUs of ``root`` (the node's simulated fleet)."""
    rows = []
    for gpu in root.gpus:
        model = get_model(gpu.model)
        fields = ("gpu", gpu.minor, model.product_name, gpu.uuid, model.memory_mib, gpu.pci_bus_id)
        rows.append("|".join(str(f) for f in fields))
        for mig in gpu.migs:
            rows.append(f"mig|{mig.parent_minor}|{mig.ci_cap_minor}|{mig.profile}|{mig.uuid}|")
    return HEADER + "\n".join(rows) + "\n" + BODY
