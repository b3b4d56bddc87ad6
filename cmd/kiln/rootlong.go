//go:build !agentonly

package main

// rootLong is kiln's own help text.
const rootLong = `kiln finds every GPU on a node (NVIDIA, AMD, Intel), shows how they are wired,
and explains what is wrong with the node, why it matters and how to fix it.

It reads the live machine (PCI sysfs, NVML, amdgpu and KFD sysfs, the kernel log)
or captures an admin already has (nvidia-smi -q / -q -x / topo -m / nvlink -s,
lspci -vvv / -tv, rocm-smi, amd-smi, KFD topology copies, dmesg, fabric manager
logs), so a machine can be audited without reaching it.

Start with:
  kiln doctor                     what is wrong with this node
  kiln inventory                  what is in it
  kiln topo                       how its GPUs, NICs and drives are connected
  kiln doctor --from FILE...      the same on captures of another machine`
