package plan

import (
	"fmt"
	"strconv"
	"strings"
)

// Layout is one way to spread a job over the GPUs.
type Layout struct {
	DP int `json:"dp"`
	TP int `json:"tp"`
	PP int `json:"pp"`
	// VP is the number of interleaved (virtual) pipeline stages per GPU;
	// 1 is the plain 1F1B schedule.
	VP int `json:"vp,omitempty"`
	// Zero is the ZeRO stage: 0 plain data parallel (DDP), 1 optimizer
	// state sharded, 2 and gradients, 3 and parameters (FSDP full shard).
	Zero int `json:"zero"`
	// Hybrid shards ZeRO-3 state only inside a node and replicates it
	// across nodes (FSDP HYBRID_SHARD).
	Hybrid bool `json:"hybrid,omitempty"`
	// MicroBatch is the sequences per micro-batch per data-parallel rank.
	MicroBatch int `json:"micro_batch"`
	// Recompute is none, selective (attention core only) or full.
	Recompute string `json:"recompute"`
	// SequenceParallel splits the non-tensor-parallel activations (norms,
	// dropout) along the sequence when TP > 1 (Megatron-LM's default).
	SequenceParallel bool `json:"sequence_parallel"`
}

// GPUs is DP x TP x PP.
func (l Layout) GPUs() int { return l.DP * l.TP * l.PP }

// Sharding names the data-parallel state sharding in words.
func (l Layout) Sharding() string {
	switch {
	case l.Zero >= 3 && l.Hybrid:
		return "FSDP hybrid shard (ZeRO-3 inside a node)"
	case l.Zero >= 3:
		return "ZeRO-3 / FSDP full shard"
	case l.Zero == 2:
		return "ZeRO-2"
	case l.Zero == 1:
		return "ZeRO-1 (distributed optimizer)"
	}
	return "DDP (no sharding)"
}

// String is the --layout form: dp=8,tp=8,pp=4,zero=1,mb=1,recompute=selective.
func (l Layout) String() string {
	z := strconv.Itoa(l.Zero)
	if l.Hybrid {
		z = "3h"
	}
	s := fmt.Sprintf("dp=%d,tp=%d,pp=%d,zero=%s,mb=%d,recompute=%s", l.DP, l.TP, l.PP, z, l.MicroBatch, l.Recompute)
	if l.VP > 1 {
		s += fmt.Sprintf(",vp=%d", l.VP)
	}
	if l.TP > 1 && !l.SequenceParallel {
		s += ",sp=false"
	}
	return s
}

// ParseLayout reads "dp=8,tp=8,pp=4,zero=1,mb=1,recompute=selective".
// Keys left out default to tp=1, pp=1, vp=1, zero=0, mb=1, recompute=none and
// sequence parallelism on; dp=0 (left out) means "whatever GPUs are left",
// which Complete fills in. zero also takes 3h (or fsdp=hybrid) for FSDP
// hybrid sharding.
func ParseLayout(s string) (Layout, error) {
	l := Layout{TP: 1, PP: 1, VP: 1, MicroBatch: 1, Recompute: RecomputeNone, SequenceParallel: true}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return l, fmt.Errorf("layout %q: %q is not key=value", s, part)
		}
		k, v = strings.ToLower(strings.TrimSpace(k)), strings.ToLower(strings.TrimSpace(v))
		num := func() (int, error) {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1<<20 {
				return 0, fmt.Errorf("layout %q: %s=%s is not a positive whole number", s, k, v)
			}
			return n, nil
		}
		var err error
		switch k {
		case "dp":
			l.DP, err = num()
		case "tp":
			l.TP, err = num()
		case "pp":
			l.PP, err = num()
		case "vp":
			l.VP, err = num()
		case "mb", "micro_batch", "microbatch":
			l.MicroBatch, err = num()
		case "zero":
			switch v {
			case "0", "1", "2", "3":
				l.Zero = int(v[0] - '0')
			case "3h", "hybrid":
				l.Zero, l.Hybrid = 3, true
			default:
				err = fmt.Errorf("layout %q: zero=%s: want 0, 1, 2, 3 or 3h (hybrid)", s, v)
			}
		case "fsdp":
			switch v {
			case "full":
				l.Zero = 3
			case "hybrid":
				l.Zero, l.Hybrid = 3, true
			case "none", "no":
			default:
				err = fmt.Errorf("layout %q: fsdp=%s: want full or hybrid", s, v)
			}
		case "recompute", "rc":
			switch v {
			case RecomputeNone, RecomputeSelective, RecomputeFull:
				l.Recompute = v
			case "no", "off", "false":
				l.Recompute = RecomputeNone
			default:
				err = fmt.Errorf("layout %q: recompute=%s: want none, selective or full", s, v)
			}
		case "sp":
			b, perr := strconv.ParseBool(v)
			if perr != nil {
				err = fmt.Errorf("layout %q: sp=%s: want true or false", s, v)
			}
			l.SequenceParallel = b
		default:
			err = fmt.Errorf("layout %q: unknown key %q (want dp, tp, pp, vp, zero, fsdp, mb, recompute, sp)", s, k)
		}
		if err != nil {
			return l, err
		}
	}
	return l, nil
}

// Complete fills DP from the number of GPUs and checks the layout uses
// them all.
func (l Layout) Complete(gpus int) (Layout, error) {
	if l.DP == 0 {
		if gpus%(l.TP*l.PP) != 0 {
			return l, fmt.Errorf("layout %s: tp x pp = %d does not divide %d GPUs", l, l.TP*l.PP, gpus)
		}
		l.DP = gpus / (l.TP * l.PP)
	}
	if l.GPUs() != gpus {
		return l, fmt.Errorf("layout %s uses dp x tp x pp = %d GPUs, not the %d given", l, l.GPUs(), gpus)
	}
	if l.VP < 1 {
		l.VP = 1
	}
	if l.DP == 1 && l.Zero > 0 {
		l.Zero, l.Hybrid = 0, false
	}
	return l, nil
}
