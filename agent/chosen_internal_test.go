package agent

import (
	"context"
	"io"
	"maps"
	"slices"
	"testing"
	"time"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/executor"
)

// pickedHandle is a running job whose devices a scheduler picked (or not
// yet: nil).
type pickedHandle struct{ picked []int }

func (pickedHandle) Logs() io.ReadCloser                         { return io.NopCloser(nil) }
func (pickedHandle) Wait(context.Context) (executor.Exit, error) { return executor.Exit{}, nil }
func (pickedHandle) Stop(context.Context, time.Duration) error   { return nil }
func (h pickedHandle) Picked() []int                             { return h.picked }

// TestChosenReportsPicks: a heartbeat names, by device ID, the devices the
// scheduler picked for the jobs that left it the choice, once known;
// positions out of range are dropped, and jobs kiln placed are not named.
func TestChosenReportsPicks(t *testing.T) {
	devs := []api.DeviceGrant{{ID: "gpu1"}, {ID: "gpu2"}, {ID: "gpu3"}}
	a := &Agent{jobs: map[string]*job{
		"j-picked":   {a: api.Assignment{JobID: "j-picked", Choose: 2, Devices: devs}, h: pickedHandle{[]int{2, 0, 7}}},
		"j-pinned":   {a: api.Assignment{JobID: "j-pinned", Devices: devs[:1]}, h: pickedHandle{[]int{0}}},
		"j-waiting":  {a: api.Assignment{JobID: "j-waiting", Choose: 1, Devices: devs}, h: pickedHandle{}},
		"j-starting": {a: api.Assignment{JobID: "j-starting", Choose: 1, Devices: devs}},
	}}
	got := a.chosen()
	if !slices.Equal(slices.Sorted(maps.Keys(got)), []string{"j-picked"}) || !slices.Equal(got["j-picked"], []string{"gpu3", "gpu1"}) {
		t.Fatalf("chosen %v, want j-picked: gpu3, gpu1", got)
	}
}
