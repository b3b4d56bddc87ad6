package frag

import "math"

// Score is FGD's node score for placing task t on node n: the fragmentation
// of n against target before the placement minus after it (milli-GPU), with
// FGD's own GPU choice. Higher is better; a negative score means the
// placement makes n more fragmented. It is -Inf when t does not fit on n.
func Score(n Node, t Task, target *Workload) float64 {
	if !Fits(n, t) {
		return math.Inf(-1)
	}
	gpus := ChooseGPUs(n, t, target)
	return target.Amount(n) - target.Amount(Apply(n, t, gpus))
}

// ChooseGPUs is FGD's GPU choice inside node n: a fractional task goes to
// the GPU whose use grows the node's fragmentation least (the first such GPU
// on ties); a whole-GPU task takes the first idle GPUs. It returns nil for a
// task without GPUs or one that does not fit.
func ChooseGPUs(n Node, t Task, target *Workload) []int {
	if !t.WantsGPU() || !Fits(n, t) {
		return nil
	}
	if !t.Sharing() {
		return FirstFree(n.Free, t.GPUMilli, t.GPUs)
	}
	best, bestAfter := -1, 0.0
	for i, f := range n.Free {
		if f < t.GPUMilli {
			continue
		}
		after := target.Amount(Apply(n, t, []int{i}))
		if best < 0 || after < bestAfter {
			best, bestAfter = i, after
		}
	}
	return []int{best}
}

// PaperScore is the integer node score of the authors' simulator: the
// fragmentation reduction delta (milli-GPU) through a sigmoid of delta/1000,
// scaled to 0..100 and truncated. Many nodes share a score; the scheduler
// picks one of them at random.
func PaperScore(delta float64) int64 {
	return int64(100 / (1 + math.Exp(-delta/1000)))
}

// FGD is FGD's decision on node n for task t, with the Memo: the GPU for a
// fractional task (-1 otherwise: whole-GPU tasks take the first idle GPUs)
// and the fragmentation reduction delta = before - after. before is
// m.Amount(n), passed in because callers cache it. If paper is true, GPUs
// are compared by PaperScore as the authors' simulator does (the first GPU
// wins among equal integer scores); otherwise by the exact delta. The task
// must fit.
func (m *Memo) FGD(n Node, t Task, before float64, paper bool) (gpu int, delta float64) {
	if !t.Sharing() {
		var after float64
		if t.WantsGPU() {
			var buf [memoGPUs]int
			gpus := firstFreeInto(buf[:0], n.Free, t.GPUMilli, t.GPUs)
			after = m.AmountAfter(n, t, gpus)
		} else {
			after = m.AmountAfter(n, t, nil)
		}
		return -1, before - after
	}
	gpu = -1
	var bestRank float64
	var seen [memoGPUs]int32
	ns := 0
	for i, f := range n.Free {
		if f < t.GPUMilli {
			continue
		}
		// GPUs with the same free capacity give the same state; the first
		// of them wins ties anyway.
		dup := false
		for j := 0; j < ns; j++ {
			if seen[j] == f {
				dup = true
				break
			}
		}
		if dup {
			continue
		}
		if ns < memoGPUs {
			seen[ns] = f
			ns++
		}
		d := before - m.amountAfterOne(n, t.CPU, t.Memory, i, t.GPUMilli)
		rank := d
		if paper {
			rank = float64(PaperScore(d))
		}
		if gpu < 0 || rank > bestRank {
			gpu, delta, bestRank = i, d, rank
		}
	}
	return gpu, delta
}

// firstFreeInto is FirstFree without allocating when dst has room.
func firstFreeInto(dst []int, free []int32, milli int32, k int) []int {
	for i, f := range free {
		if len(dst) == k {
			break
		}
		if f >= milli {
			dst = append(dst, i)
		}
	}
	return dst
}
