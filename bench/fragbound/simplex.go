package main

import (
	"errors"
	"math"
)

// errInfeasible: no x meets the constraints.
var errInfeasible = errors.New("infeasible")

// simplex minimizes c·x subject to A x = b, x >= 0, by the two-phase
// tableau method. It prices by the most negative reduced cost and falls
// back to Bland's rule (which cannot cycle) after a run of pivots that do
// not lower the objective, as the degenerate programs here need.
func simplex(A [][]float64, b, c []float64) (float64, error) {
	const eps = 1e-9
	m, n := len(A), len(c)
	w := n + m + 1 // columns: x, one artificial per row, right-hand side
	rhs := w - 1
	t := make([][]float64, m)
	basis := make([]int, m)
	for i := range m {
		row := make([]float64, w)
		sign := 1.0
		if b[i] < 0 {
			sign = -1
		}
		for j := range n {
			row[j] = sign * A[i][j]
		}
		row[n+i] = 1
		row[rhs] = sign * b[i]
		t[i], basis[i] = row, n+i
	}
	pivot := func(r, j int) {
		p := t[r][j]
		for k := range t[r] {
			t[r][k] /= p
		}
		for i := range m {
			if i == r || t[i][j] == 0 {
				continue
			}
			f := t[i][j]
			for k := range t[i] {
				t[i][k] -= f * t[r][k]
			}
		}
		basis[r] = j
	}
	value := func(cost []float64) float64 {
		var v float64
		for i, bi := range basis {
			v += cost[bi] * t[i][rhs]
		}
		return v
	}
	run := func(cost []float64, allowed int) error {
		z := make([]float64, w)
		bland, stall, last := false, 0, math.Inf(1)
		for iter := 0; iter < 200000; iter++ {
			for j := range allowed {
				z[j] = cost[j]
			}
			for i, bi := range basis {
				if cb := cost[bi]; cb != 0 {
					for j := range allowed {
						z[j] -= cb * t[i][j]
					}
				}
			}
			enter := -1
			for j := range allowed {
				if z[j] < -eps && (enter < 0 || (!bland && z[j] < z[enter])) {
					enter = j
					if bland {
						break
					}
				}
			}
			if enter < 0 {
				return nil
			}
			leave := -1
			var best float64
			for i := range m {
				if a := t[i][enter]; a > eps {
					q := t[i][rhs] / a
					if leave < 0 || q < best-eps || (q < best+eps && basis[i] < basis[leave]) {
						leave, best = i, q
					}
				}
			}
			if leave < 0 {
				return errors.New("unbounded")
			}
			pivot(leave, enter)
			if v := value(cost); v < last-eps {
				last, stall = v, 0
			} else if stall++; stall > 50 {
				bland = true
			}
		}
		return errors.New("simplex did not converge")
	}
	// Phase 1: drive the artificials to zero.
	phase1 := make([]float64, w)
	for i := range m {
		phase1[n+i] = 1
	}
	if err := run(phase1, n+m); err != nil {
		return 0, err
	}
	if value(phase1) > 1e-6 {
		return 0, errInfeasible
	}
	for i := range m {
		if basis[i] < n {
			continue
		}
		for j := range n {
			if math.Abs(t[i][j]) > eps {
				pivot(i, j)
				break
			}
		}
	}
	// Phase 2: the objective, artificials kept out.
	cost := make([]float64, w)
	copy(cost, c)
	if err := run(cost, n); err != nil {
		return 0, err
	}
	return value(cost), nil
}
