// Package plan estimates how a transformer trains or serves on a set of
// GPUs: the memory each GPU needs, the time a step takes and where it goes,
// for every layout of data, tensor and pipeline parallelism, ZeRO/FSDP
// sharding, micro-batch and activation recomputation, and picks the best.
//
// The models are the published ones, cited where they are used:
//   - model-state memory: Rajbhandari et al. 2020, "ZeRO: Memory
//     Optimizations Toward Training Trillion Parameter Models" (section 3.1,
//     K = 12 bytes of optimizer state per parameter for mixed-precision Adam);
//   - activation memory: Korthikanti et al. 2022, "Reducing Activation
//     Recomputation in Large Transformer Models", Table 2 (per-layer bytes
//     with tensor and sequence parallelism, selective and full recomputation);
//   - FLOPs: Narayanan et al. 2021, "Efficient Large-Scale Language Model
//     Training on GPU Clusters Using Megatron-LM", section 5.1 (96·B·s·l·h²·
//     (1 + s/6h + V/16lh) with full recomputation), generalised to grouped-
//     query attention, gated MLPs and mixtures of experts;
//   - communication: ring collectives over the slowest link of each group,
//     from the node's link matrix (kiln topo) and the network bandwidth.
//
// The package is pure: hardware comes in as a Cluster (built from a
// snapshot's topo.Matrix or from the GPU catalog), models as a Model
// (catalog or Hugging Face config.json bytes). It does no I/O.
package plan
