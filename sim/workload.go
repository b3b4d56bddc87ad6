package sim

import (
	"math/rand"
	"slices"
	"strings"

	"kiln.dev/kiln/sched/frag"
)

// Arrivals returns the order in which the experiment submits tasks (indices
// into pods) for one seed, the way the authors' simulator builds it:
//
//  1. a math/rand source seeded with seed (one value is drawn and dropped,
//     as the simulator does when it logs the seed);
//  2. the tasks sorted by name, then shuffled;
//  3. the workload tuned to ratio times the cluster's GPU capacity: while
//     the total GPU request is below it, a task drawn with replacement from
//     the trace (sorted by name) is appended, stopping at the first draw
//     whose per-GPU share would pass the target; while it is above, a
//     random task is removed;
//  4. the nodes, sorted by name, given a random rank (a permutation drawn
//     next from the same source). The simulator prefixes node names with
//     it, and its scheduler breaks ties between equal scores by the
//     smallest name: the node of lowest rank wins.
//
// The same seed gives the same order and ranks. ratio <= 0 keeps the
// shuffled trace.
func Arrivals(pods []Pod, nodes []Node, seed int64, ratio float64) (order, rank []int) {
	var capacityMilli int64
	for _, n := range nodes {
		capacityMilli += int64(n.GPUs) * frag.MilliPerGPU
	}
	byName := make([]int, len(pods))
	for i := range byName {
		byName[i] = i
	}
	slices.SortStableFunc(byName, func(a, b int) int { return strings.Compare(pods[a].Name, pods[b].Name) })

	r := rand.New(rand.NewSource(seed))
	r.Int()
	order = slices.Clone(byName)
	r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	var total int64
	for _, i := range order {
		total += pods[i].GPUTotal()
	}
	target := ratio * float64(capacityMilli)
	switch {
	case ratio <= 0:
	case float64(total) > target:
		for float64(total) > target && len(order) > 0 {
			k := r.Intn(len(order))
			total -= pods[order[k]].GPUTotal()
			order = slices.Delete(order, k, k+1)
		}
	case float64(total) < target && total > 0:
		for {
			p := byName[r.Intn(len(byName))]
			// The simulator compares the per-GPU share, not the whole
			// request, with what is left; kept for fidelity.
			if float64(total+int64(pods[p].GPUMilli)) > target {
				break
			}
			total += pods[p].GPUTotal()
			order = append(order, p)
		}
	}
	nodesByName := make([]int, len(nodes))
	for i := range nodesByName {
		nodesByName[i] = i
	}
	slices.SortStableFunc(nodesByName, func(a, b int) int { return strings.Compare(nodes[a].Name, nodes[b].Name) })
	perm := r.Perm(len(nodes))
	rank = make([]int, len(nodes))
	for i, n := range nodesByName {
		rank[n] = perm[i]
	}
	return order, rank
}

// Tasks returns the tasks of pods.
func Tasks(pods []Pod) []frag.Task {
	out := make([]frag.Task, len(pods))
	for i, p := range pods {
		out[i] = p.Task
	}
	return out
}
