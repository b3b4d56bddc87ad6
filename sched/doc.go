// Package sched is kiln's placement engine: it decides which node, which
// GPUs, which share of a GPU or which MIG slot a request gets.
//
// The inventory is a list of Nodes, built from Snapshots by NodeFromSnapshot
// (devices with model, memory, compute capability or gfx target, MIG
// geometry and instances, health from the doctor's critical findings, and
// the pairwise link matrix from topo.Build) or by hand. NewCluster freezes
// the inventory and groups identical nodes; NewState gives an empty
// allocation state over it.
//
// A Scheduler places Requests (whole GPUs, a fraction of one GPU in
// milli-GPU plus memory, or a MIG profile; CPU and host memory; constraints
// and locality) and Gangs (requests placed all together or not at all) in
// the spirit of the Kubernetes scheduler framework:
//
//   - DeviceFilters decide which devices of a node may serve a request.
//     They look only at the static inventory, so they run once per group of
//     identical nodes, not once per node.
//   - NodeFilters reject nodes on their current usage (CPU, host memory).
//   - A Picker chooses the GPU set inside a node. TopologyPicker takes,
//     among the feasible sets, the one whose slowest pair is fastest (NVLink
//     before a PCIe switch, a switch before the host bridge, one NUMA node
//     before two) and, among equals, the one that cuts the fewest good links
//     to the GPUs left free, so well-connected sets stay whole.
//   - ScorePlugins rate each candidate in [0, 1]; the weighted sum decides,
//     ties broken by a seeded hash so that the same seed gives the same
//     placement.
//
// Nodes are pre-indexed by free whole GPUs and by the largest free share of
// a partly used GPU, and scanned tightest first; at most MaxScored feasible
// nodes are scored, so a decision costs about the same at 1,000 and at
// 10,000 nodes.
//
// The State is an explicit value. Place and PlaceGang read it and return an
// Allocation or a Plan without changing it; Commit applies a plan after
// checking every share again (all or nothing), Release frees an allocation.
// Nothing here does I/O.
package sched
