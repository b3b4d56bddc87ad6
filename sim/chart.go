package sim

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// palette gives each policy a colour that stays the same across charts.
var palette = map[string]color.RGBA{
	"random":     {0x99, 0x99, 0x99, 0xff},
	"dotprod":    {0x8c, 0x56, 0x4b, 0xff},
	"clustering": {0x94, 0x67, 0xbd, 0xff},
	"packing":    {0x2c, 0xa0, 0x2c, 0xff},
	"bestfit":    {0xff, 0x7f, 0x0e, 0xff},
	"fgd":        {0x1f, 0x77, 0xb4, 0xff},
	"kiln":       {0xd6, 0x27, 0x28, 0xff},
}

// Plot draws the mean GPU allocation rate of each policy against the
// arrived workload.
func (e *Experiment) Plot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("GPU allocation, trace %s (%d GPUs, mean of %d seeds)", e.Trace, e.GPUs, len(e.Seeds))
	p.X.Label.Text = "arrived workload (% of GPU capacity)"
	p.Y.Label.Text = "GPU allocation rate (%)"
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	for _, s := range e.Summary {
		pts := make(plotter.XYs, 0, len(s.Curve))
		for _, c := range s.Curve {
			pts = append(pts, plotter.XY{X: float64(c.Arrived), Y: c.Alloc})
		}
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		col, ok := palette[s.Policy]
		if !ok {
			col = color.RGBA{A: 0xff}
		}
		l.Color = col
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s %.2f%% @130", s.Policy, s.Alloc130Mean), l)
	}
	p.Legend.ThumbnailWidth = vg.Points(20)
	p.Y.Max = 100
	p.X.Min = 0
	return p, nil
}

// WritePNG draws Plot into a PNG file.
func (e *Experiment) WritePNG(path string) error {
	p, err := e.Plot()
	if err != nil {
		return err
	}
	p.Legend.Padding = vg.Points(2)
	p.Legend.YOffs = -vg.Points(4)
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}
