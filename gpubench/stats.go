package gpubench

import (
	"slices"
	"time"
)

// Stats are the median, slowest and fastest of a set of figures.
type Stats struct {
	Median, Min, Max float64
}

// summarize returns the median (the mean of the two middle values for an
// even count), minimum and maximum of xs; zero for none.
func summarize(xs []float64) Stats {
	if len(xs) == 0 {
		return Stats{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Stats{Median: med, Min: s[0], Max: s[n-1]}
}

// gbps is bytes moved in d, in GB/s (10^9 bytes per second); 0 for a
// duration that is not positive.
func gbps(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / d.Seconds() / 1e9
}

// BusFactor is what nccl-tests multiplies a collective's algorithm
// bandwidth (size / time) by to get its bus bandwidth, the figure
// comparable with one direction of the slowest link whatever the number of
// ranks: 2(n-1)/n for all-reduce, (n-1)/n for all-gather and
// reduce-scatter (where size is the whole gathered or scattered buffer).
func BusFactor(op Op, ranks int) float64 {
	if ranks < 1 {
		return 0
	}
	n := float64(ranks)
	switch op {
	case AllReduce:
		return 2 * (n - 1) / n
	case AllGather, ReduceScatter:
		return (n - 1) / n
	}
	return 0
}
