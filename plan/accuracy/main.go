// Command accuracy prints docs/plan-accuracy.md: kiln plan's predictions
// next to published measurements.
//
//	go run ./plan/accuracy > docs/plan-accuracy.md
package main

import (
	"fmt"
	"os"

	"kiln.dev/kiln/kb"
	"kiln.dev/kiln/plan"
)

func main() {
	rows, err := plan.Accuracy(kb.Default())
	if err != nil {
		fmt.Fprintln(os.Stderr, "accuracy:", err)
		os.Exit(1)
	}
	fmt.Print(plan.AccuracyMarkdown(rows))
}
