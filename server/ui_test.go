package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/server"
	"kiln.dev/kiln/snapshot"
	"kiln.dev/kiln/testenv"
)

// TestWebPageSignIn: the sign-in link works once; the page's data needs
// the session, and a session ends with the token that made it.
func TestWebPageSignIn(t *testing.T) {
	c := newCluster(t, server.Config{})
	ctx := context.Background()
	u := c.user("ana", "default")
	link, err := u.UILink(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hc := c.browserClient(t)
	if resp, err := hc.Get(c.url + "/ui/api/fleet"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the page's data without a session: %v %v, want 401", err, status(resp))
	}
	resp, err := hc.Get(link.URL)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("sign-in: %v %v", err, status(resp))
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("the page's content security policy is %q", csp)
	}
	// A node page's address may hold dots (node names do): it is the page.
	if resp, err := hc.Get(c.url + "/ui/nodes/gpu-node.lab-1"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("a node page with a dot in its name: %v %v, want the page", err, status(resp))
	}
	base := c.url + "/ui/api/fleet"
	if resp, err := hc.Get(base); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the page's data with the session: %v %v", err, status(resp))
	}
	// A member sees nothing of another project: not its queued lease, not
	// its page, not its name.
	c.project("secret", 1)
	var hidden api.Lease
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "secret", GPUs: 1}, &hidden); err != nil {
		t.Fatal(err)
	}
	resp, err = hc.Get(c.url + "/ui/api/fleet")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(body), "secret") || strings.Contains(string(body), hidden.ID) {
		t.Errorf("a member's fleet view shows another project's lease: %s", body)
	}
	if resp, err := hc.Get(c.url + "/ui/api/leases/" + hidden.ID); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("a member asks for another project's lease page: %v %v, want 404", err, status(resp))
	}
	// A second browser with the same link is refused: the code is spent.
	other := c.browserClient(t)
	if resp, err := other.Get(link.URL); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the link used a second time: %v %v, want 401", err, status(resp))
	}
	// Revoking the token ends the session.
	toks, err := u.Tokens(ctx)
	if err != nil || len(toks) == 0 {
		t.Fatalf("tokens: %v %+v", err, toks)
	}
	if err := u.DeleteToken(ctx, toks[0].ID); err != nil {
		t.Fatal(err)
	}
	if resp, err := hc.Get(base); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the page's data after the token was revoked: %v %v, want 401", err, status(resp))
	}
}

// browserClient is a browser's HTTP client: cookies kept, the server's
// CA trusted, redirects followed.
func (c *cluster) browserClient(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.srv.CAPEM())
	return &http.Client{Jar: jar, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

func status(r *http.Response) string {
	if r == nil {
		return "no answer"
	}
	r.Body.Close()
	return r.Status
}

// TestWebPageInBrowser drives the page in headless Chromium (Debian's)
// against a server fed with recorded machines: every page loads with no
// console error and no request outside loopback; the fleet lists every
// node and its totals are the sums of its rows; the node page draws one
// box per GPU and labels its links; a finding shows its fix; a GPU's
// cell is filled by the utilisation its agent sends, and its page draws
// the readings' history; a lease granted while the page is open shows
// within 5 s. A screenshot of each
// page is kept; two nodes of one GPU model on different firmware show a
// fleet finding with its fix (KILN_ARTIFACTS, else a temporary folder; the log says
// where).
func TestWebPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Chromium")
	}
	chromium := testenv.Need(t, "chromium", "apt-get install chromium")
	c := newCluster(t, server.Config{HeartbeatTimeout: 3 * time.Second})
	ms := machines(t)
	// GPU 0 of the HGX is busy: the page fills its cell by that.
	busy := *ms["hgx"]
	busy.GPUs = append([]snapshot.GPU(nil), busy.GPUs...)
	busy.GPUs[0].UtilizationGPU = snapshot.Ptr(75.0)
	busy.GPUs[0].Processes = 2
	c.addAgent("hgx", &busy, nil, 300*time.Millisecond)
	// A second HGX on older firmware: a finding only the fleet shows.
	old := *ms["hgx"]
	old.GPUs = append([]snapshot.GPU(nil), old.GPUs...)
	for i := range old.GPUs {
		old.GPUs[i].VBIOS = "96.00.61.00.01"
	}
	c.addAgent("hgx2", &old, nil, 300*time.Millisecond)
	c.addAgent("pcie", ms["pcie"], nil, 300*time.Millisecond)
	c.addAgent("mi300x", ms["mi300x"], nil, 300*time.Millisecond)
	c.waitNodes(4)
	ctx := context.Background()
	var l api.Lease
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 2, Constraints: api.Constraints{Nodes: []string{"hgx"}}}, &l); err != nil || l.State != api.LeaseGranted {
		t.Fatalf("lease: %v %+v", err, l)
	}
	first := l.ID
	link, err := c.admin.UILink(ctx)
	if err != nil {
		t.Fatal(err)
	}
	shots := os.Getenv("KILN_ARTIFACTS")
	if shots == "" {
		shots = t.TempDir()
	}
	shots = filepath.Join(shots, "ui")
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.Headless,
		// The server's certificate comes from its own CA.
		chromedp.IgnoreCertErrors,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("no-first-run", true), chromedp.Flag("disable-domain-reliability", true),
		chromedp.WindowSize(1400, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	bctx, cancelTime := context.WithTimeout(bctx, 2*time.Minute)
	defer cancelTime()

	var mu sync.Mutex
	var problems, outside []string
	if err := chromedp.Listen(bctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventExceptionThrown:
			problems = append(problems, "exception: "+e.ExceptionDetails.Text+" "+fmt.Sprint(e.ExceptionDetails.Exception))
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError {
				var args []string
				for _, a := range e.Args {
					args = append(args, string(a.Value))
				}
				problems = append(problems, "console.error: "+strings.Join(args, " "))
			}
		case *log.EventEntryAdded:
			if e.Entry.Level == log.EntryLevelError {
				problems = append(problems, "log: "+e.Entry.Text+" "+e.Entry.URL)
			}
		case *network.EventRequestWillBeSent:
			u, err := url.Parse(e.Request.URL)
			if err != nil || (u.Scheme != "data" && u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost" && u.Hostname() != "::1") {
				outside = append(outside, e.Request.URL)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	// chromedp enables the log, network and runtime domains of the tab.
	shot := func(name string) {
		t.Helper()
		b, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot of %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name+".png"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	eval := func(js string) int {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[int](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return v
	}
	text := func(js string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return v
	}
	open := func(u, ready string) {
		t.Helper()
		if err := chromedp.Do(bctx, chromedp.Navigate(u), chromedp.WaitVisible(chromedp.CSS(ready))); err != nil {
			t.Fatalf("%s: %v", u, err)
		}
	}

	// The fleet: every node, totals that are the sums of their rows.
	open(link.URL, "table#fleet tfoot")
	if rows := eval(`document.querySelectorAll("table#fleet tbody tr").length`); rows != 4 {
		t.Errorf("the fleet lists %d nodes, want 4", rows)
	}
	if got := text(`(document.querySelector('#fleet-findings [data-finding="fleet-vbios-mixed"]')||{}).textContent || ""`); !strings.Contains(got, "96.00.61.00.01 on hgx2") || !strings.Contains(got, "Fix:") {
		t.Errorf("the fleet's VBIOS finding says %q; want the versions by node and the fix", got)
	}
	for _, k := range []string{"gpus", "held", "free", "drained"} {
		sum := eval(`(() => { let s = 0; for (const td of document.querySelectorAll('table#fleet tbody td[data-col="` + k + `"]')) s += Number(td.textContent); return s; })()`)
		total := eval(`Number(document.querySelector('table#fleet td[data-total="` + k + `"]').textContent)`)
		if sum != total {
			t.Errorf("fleet %s: rows add up to %d, the total says %d", k, sum, total)
		}
		if k == "held" && total != 2 {
			t.Errorf("fleet: %d GPUs held, want the lease's 2", total)
		}
	}
	// Cells are filled by the agents' readings: the busy GPU at 75%.
	fill := text(`(() => { const f = document.querySelector('[data-map-node="hgx"] .cell .fill'); return f ? f.style.height : ""; })()`)
	if fill != "75%" {
		t.Errorf("the busy GPU's cell is filled %q, want 75%%", fill)
	}
	shot("fleet")

	// A lease granted while the page is open shows within 5 s.
	if err := c.admin.Do(ctx, "POST", "/v1/leases", api.LeaseRequest{Project: "default", GPUs: 1, Constraints: api.Constraints{Nodes: []string{"pcie"}}}, &l); err != nil || l.State != api.LeaseGranted {
		t.Fatalf("second lease: %v %+v", err, l)
	}
	start := time.Now()
	held := ""
	for time.Since(start) < 5*time.Second {
		if held = text(`document.querySelector('table#fleet td[data-total="held"]').textContent`); held == "3" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if held != "3" {
		t.Errorf("5 s after a lease was granted, the page shows %s GPUs held, want 3", held)
	} else {
		t.Logf("the page showed the new lease %s after it was granted", time.Since(start).Round(time.Millisecond))
	}

	// The node page: a box per GPU, labelled links, findings with a fix.
	open(c.url+"/ui/nodes/hgx", "svg.topo")
	if boxes := eval(`document.querySelectorAll("svg.topo rect.gpu").length`); boxes != 8 {
		t.Errorf("the node page draws %d GPU boxes for an 8-GPU node", boxes)
	}
	labels := eval(`document.querySelectorAll("svg.topo text.link-label").length`)
	label := text(`(document.querySelector("svg.topo text.link-label")||{}).textContent || ""`)
	if labels == 0 || !strings.Contains(label, "per direction") && !strings.Contains(label, "PCIe") {
		t.Errorf("link labels: %d, the first %q; want labels with their bandwidth", labels, label)
	}
	if fixes := eval(`document.querySelectorAll("#findings .finding .remedy").length`); fixes == 0 {
		t.Errorf("no finding on the hgx node shows its fix")
	}
	if n := eval(`document.querySelectorAll('table#gpus svg.spark polyline.series').length`); n != 8 {
		t.Errorf("the node page draws %d recent-utilisation lines, want one per GPU (8)", n)
	}
	if procs := text(`document.querySelector('table#gpus tbody tr td[data-col="procs"]').textContent`); procs != "2" {
		t.Errorf("the node page shows %q processes on GPU 0, want its agent's 2", procs)
	}
	if links := eval(`document.querySelectorAll('table#gpus a[href="/ui/leases/` + first + `"]').length`); links != 2 {
		t.Errorf("the node page links the lease from %d GPUs, want its 2", links)
	}
	shot("node-hgx")

	// The lease's page: its state and where it holds GPUs.
	open(c.url+"/ui/leases/"+first, "table#lease")
	if st := text(`document.querySelector('table#lease td').textContent`); st != "granted" {
		t.Errorf("the lease page says %q, want granted", st)
	}
	if got := text(`document.querySelector('#allocations').textContent`); !strings.HasPrefix(got, "hgx: ") {
		t.Errorf("the lease page's GPUs: %q", got)
	}
	shot("lease")

	// A GPU's page draws its hour of readings, the utilisation at 75%.
	open(c.url+"/ui/nodes/hgx/gpus/0", `svg.chart[data-chart="util"]`)
	if n := eval(`document.querySelectorAll('svg.chart[data-chart="util"] polyline.series').length`); n != 1 {
		t.Errorf("the GPU page draws %d utilisation lines, want 1", n)
	}
	if now := text(`document.querySelector('svg.chart[data-chart="util"]').textContent`); !strings.Contains(now, "now 75 %") {
		t.Errorf("the utilisation chart says %q, want now 75 %%", now)
	}
	shot("gpu-hgx-0")

	// The projects: the default project's held GPUs are busy by the
	// readings: the HGX's GPU 0 at 75%, its GPU 1 idle, the PCIe node's
	// GPU at the fixture's 90%.
	open(c.url+"/ui/projects", "table#projects")
	if busy := text(`document.querySelector('tr[data-project="default"] td[data-col="busy"]').textContent`); busy != "55%" {
		t.Errorf("the default project's busy figure is %q, want 55%% (the mean of 75, 0 and 90)", busy)
	}
	shot("projects")

	for _, page := range []string{"queue", "nodes/mi300x", "nodes/pcie"} {
		open(c.url+"/ui/"+page, "main h1")
		shot(strings.ReplaceAll(page, "/", "-"))
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Errorf("the page logged an error: %s", p)
	}
	for _, u := range outside {
		t.Errorf("the page asked for something outside loopback: %s", u)
	}
	t.Logf("screenshots in %s", shots)
}
