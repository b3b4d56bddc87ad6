//go:build !agentonly

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"kiln.dev/kiln/api"
)

// openAI calls a deployment through the server's OpenAI-compatible
// endpoint, with the user's kiln token as the API key.
type openAI struct {
	base  string // https://SERVER/openai/v1
	token string
	// project is the deployment's: a name routes inside one project.
	project string
	http    *http.Client
}

// maxAnswer bounds what kiln serve test reads of one answer.
const maxAnswer = 16 << 20

func (o *openAI) post(ctx context.Context, path string, body any) (*http.Response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.base+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+o.token)
	if o.project != "" {
		req.Header.Set("OpenAI-Project", o.project)
	}
	resp, err := o.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(msg, &e) == nil && e.Error.Message != "" {
			return nil, fmt.Errorf("%s: %s", resp.Status, e.Error.Message)
		}
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	return resp, nil
}

// decode posts and reads a whole JSON answer.
func (o *openAI) decode(ctx context.Context, path string, body, out any) error {
	resp, err := o.post(ctx, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(out)
}

// streamed is one streamed chat completion as the client saw it.
type streamed struct {
	text       string
	ttft       time.Duration   // to the first token
	gaps       []time.Duration // between tokens
	total      time.Duration
	completion int // tokens, as the usage says, else the events with text
}

// streamChat sends a streamed chat completion and times its tokens.
func (o *openAI) streamChat(ctx context.Context, model, prompt string, maxTokens int) (streamed, error) {
	var out streamed
	t0 := time.Now()
	resp, err := o.post(ctx, "/chat/completions", map[string]any{"model": model, "stream": true, "max_tokens": maxTokens,
		"stream_options": map[string]any{"include_usage": true}, "messages": []any{map[string]any{"role": "user", "content": prompt}}})
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, maxAnswer))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var last time.Time
	var text strings.Builder
	events, usage, done := 0, -1, false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			done = true
			break
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return out, fmt.Errorf("a streamed event is not JSON: %w", err)
		}
		if ev.Usage != nil {
			usage = ev.Usage.CompletionTokens
		}
		for _, c := range ev.Choices {
			if c.Delta.Content == "" {
				continue
			}
			now := time.Now()
			if events == 0 {
				out.ttft = now.Sub(t0)
			} else {
				out.gaps = append(out.gaps, now.Sub(last))
			}
			last = now
			events++
			text.WriteString(c.Delta.Content)
		}
	}
	if err := sc.Err(); err != nil {
		return out, err
	}
	if !done {
		return out, errors.New("the stream ended without data: [DONE]")
	}
	if events == 0 {
		return out, errors.New("the stream held no token")
	}
	out.text, out.total, out.completion = text.String(), time.Since(t0), events
	if usage >= 0 {
		out.completion = usage
	}
	return out, nil
}

// smoke runs one request of each kind.
func (o *openAI) smoke(ctx context.Context, model, prompt string, maxTokens int) []api.ServeSmoke {
	var out []api.ServeSmoke
	check := func(name string, err error, detail string) {
		s := api.ServeSmoke{Name: name, OK: err == nil, Detail: detail}
		if err != nil {
			s.Detail = err.Error()
		}
		s.Detail = truncText(printable(s.Detail), 1000)
		out = append(out, s)
	}
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	err := o.get(ctx, "/models", &models)
	if err == nil && !slices.ContainsFunc(models.Data, func(m struct {
		ID string `json:"id"`
	}) bool {
		return m.ID == model
	}) {
		err = fmt.Errorf("GET /models does not list %s", model)
	}
	check("models", err, "")
	var cmpl struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	err = o.decode(ctx, "/completions", map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens}, &cmpl)
	if err == nil && (len(cmpl.Choices) == 0 || cmpl.Choices[0].Text == "") {
		err = errors.New("the completion has no text")
	}
	check("completion", err, firstText(len(cmpl.Choices) > 0, func() string { return cmpl.Choices[0].Text }))
	var chat struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	err = o.decode(ctx, "/chat/completions", map[string]any{"model": model, "max_tokens": maxTokens,
		"messages": []any{map[string]any{"role": "user", "content": prompt}}}, &chat)
	if err == nil && (len(chat.Choices) == 0 || chat.Choices[0].Message.Content == "") {
		err = errors.New("the chat turn has no answer")
	}
	check("chat", err, firstText(len(chat.Choices) > 0, func() string { return chat.Choices[0].Message.Content }))
	st, err := o.streamChat(ctx, model, prompt, maxTokens)
	check("stream", err, st.text)
	return out
}

func firstText(ok bool, f func() string) string {
	if !ok {
		return ""
	}
	return f()
}

func (o *openAI) get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.base+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+o.token)
	if o.project != "" {
		req.Header.Set("OpenAI-Project", o.project)
	}
	resp, err := o.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(out)
}

// load runs n streamed chat completions, conc at once, and summarises
// them; progress is called after each.
func (o *openAI) load(ctx context.Context, model, prompt string, maxTokens, conc, n int, timeout time.Duration, progress func(done int)) api.ServeLoad {
	var mu sync.Mutex
	var ttfts, gaps, totals []time.Duration
	var tokens, errs int
	var firstErr string
	var next, done atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				rctx, cancel := context.WithTimeout(ctx, timeout)
				st, err := o.streamChat(rctx, model, prompt, maxTokens)
				cancel()
				mu.Lock()
				if err != nil {
					errs++
					if firstErr == "" {
						firstErr = truncText(printable(err.Error()), 1000)
					}
				} else {
					ttfts, totals, gaps = append(ttfts, st.ttft), append(totals, st.total), append(gaps, st.gaps...)
					tokens += st.completion
				}
				mu.Unlock()
				progress(int(done.Add(1)))
			}
		}()
	}
	wg.Wait()
	secs := time.Since(t0).Seconds()
	return api.ServeLoad{Concurrency: conc, Requests: n, Errors: errs, Seconds: secs,
		RequestsPerSecond: float64(n-errs) / secs, OutputTokensPerSecond: float64(tokens) / secs,
		TTFTP50MS: ms(pctOf(ttfts, 50)), TTFTP99MS: ms(pctOf(ttfts, 99)), ITLP50MS: ms(pctOf(gaps, 50)), ITLP99MS: ms(pctOf(gaps, 99)),
		LatencyP50MS: ms(pctOf(totals, 50)), LatencyP99MS: ms(pctOf(totals, 99)), FirstError: firstErr}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pctOf is the q-th percentile (nearest rank); 0 of none.
func pctOf(d []time.Duration, q int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := (len(d)*q + 99) / 100
	return d[min(max(i-1, 0), len(d)-1)]
}

// truncText cuts s to at most n bytes, on a character's boundary.
func truncText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

func newServeTestCmd() *cobra.Command {
	var cf clientFlags
	var project, prompt string
	var levels []int
	var requests, maxTokens int
	var timeout time.Duration
	var noSave bool
	cmd := &cobra.Command{
		Use:   "test NAME",
		Short: "Smoke-test and load-test a deployment through the endpoint, and keep the results",
		Long: `kiln serve test calls a ready deployment the way its users do, through the
server's OpenAI-compatible endpoint with your kiln token:

  smoke  GET /models lists it; a completion, a chat turn and a streamed chat
         each answer;
  load   streamed chat completions at each --concurrency (1, 4, 16 by default),
         --requests of them a level (at least one per stream): requests and
         output tokens per second, time to the first token (TTFT), time between
         tokens (ITL) and the whole answer's latency at p50 and p99, errors.

Output tokens are what the engine's usage reports, else the streamed events
that carry text. The results are kept with the deployment on the server, with
where it runs (engine, image, node, GPUs), so the same model can be compared
across nodes, GPUs and engines: 'kiln serve tests NAME' lists them.

Exit codes: 0 every check passed and no request failed, 2 otherwise, 3 when
kiln could not ask.`,
		Example: `  kiln serve test llama-3-8b
  kiln serve test llama-3-8b --concurrency 1,8,32,64 --requests 128 --max-tokens 256
  kiln serve test llama-3-8b -o json
  kiln serve tests llama-3-8b`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			for _, c := range levels {
				if c < 1 || c > 1024 {
					return &exitError{code: 3, err: fmt.Errorf("--concurrency %d: want 1 to 1024", c)}
				}
			}
			if requests < 1 || maxTokens < 1 {
				return &exitError{code: 3, err: errors.New("--requests and --max-tokens must be 1 or more")}
			}
			c, cfg, err := cf.connect()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			stderr := cmd.ErrOrStderr()
			ds, err := deployments(ctx, c, project, false)
			if err != nil {
				return apiErr(err)
			}
			var dep *api.Lease
			for i, l := range ds {
				if l.Request.Serve.Model == name && l.Deployment != nil && l.Deployment.State == api.DeployReady {
					dep = &ds[i]
					break
				}
			}
			if dep == nil {
				return &exitError{code: 2, err: fmt.Errorf("no ready deployment named %s (kiln serve ls)", printable(name))}
			}
			o := &openAI{base: strings.TrimRight(cfg.Server, "/") + "/openai/v1", token: c.Token, project: dep.Project, http: c.HTTP}
			tty := colorOK(stderr)
			fmt.Fprintf(stderr, "kiln: testing %s (lease %s)\n", printable(name), printable(dep.ID))
			res := api.ServeTest{Smoke: o.smoke(ctx, name, prompt, maxTokens)}
			failed := false
			for _, s := range res.Smoke {
				failed = failed || !s.OK
			}
			for _, conc := range levels {
				n := max(requests, conc)
				var pmu sync.Mutex
				bar := &progressBar{w: stderr, width: terminalWidth()}
				progress := func(done int) {
					if tty {
						pmu.Lock()
						bar.update(done, n, fmt.Sprintf("load test, %d streams", conc))
						pmu.Unlock()
					}
				}
				l := o.load(ctx, name, prompt, maxTokens, conc, n, timeout, progress)
				if tty {
					bar.clear()
				}
				if ctx.Err() != nil {
					return &exitError{code: 3, err: ctx.Err()}
				}
				failed = failed || l.Errors > 0
				res.Load = append(res.Load, l)
			}
			if !noSave {
				kept, err := c.AddServeTest(ctx, dep.ID, res)
				if err != nil {
					fmt.Fprintf(stderr, "kiln: the results were not kept: %s\n", printable(err.Error()))
				} else {
					res = *kept
				}
			}
			if cf.structured() {
				if err := writeStructured(cmd.OutOrStdout(), cf.format, res); err != nil {
					return err
				}
			} else {
				writeServeTest(cmd.OutOrStdout(), res)
			}
			if failed {
				return &exitError{code: 2}
			}
			return nil
		},
	}
	cf.add(cmd)
	cf.addOutput(cmd)
	fl := cmd.Flags()
	fl.StringVarP(&project, "project", "p", "", "the deployment's project (default: any of yours)")
	fl.IntSliceVar(&levels, "concurrency", []int{1, 4, 16}, "streams at once, one load level each (comma-separated)")
	fl.IntVar(&requests, "requests", 32, "requests a level (at least one per stream)")
	fl.IntVar(&maxTokens, "max-tokens", 64, "tokens each answer may take")
	fl.StringVar(&prompt, "prompt", "Write one sentence about GPUs.", "the prompt of every request")
	fl.DurationVar(&timeout, "timeout", 2*time.Minute, "a request that takes longer fails")
	fl.BoolVar(&noSave, "no-save", false, "print the results without keeping them on the server")
	return cmd
}

func writeServeTest(w io.Writer, t api.ServeTest) {
	where := t.Node
	if t.GPUs > 0 {
		where = fmt.Sprintf("%s, %d x %s", t.Node, t.GPUs, t.GPUModel)
	}
	if t.ID != "" {
		fmt.Fprintf(w, "test %s of %s (%s on %s)\n", printable(t.ID), printable(t.Model), printable(t.Engine), printable(where))
	}
	for _, s := range t.Smoke {
		mark := "ok  "
		if !s.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s %-10s %s\n", mark, printable(s.Name), printable(truncText(s.Detail, 80)))
	}
	writeLoadTable(w, []api.ServeTest{t}, false)
}

// writeLoadTable prints a row per load level; with who, the test's
// model, engine and node on each.
func writeLoadTable(w io.Writer, ts []api.ServeTest, who bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	head := "CONC\tREQUESTS\tERRORS\tREQ/S\tOUT TOK/S\tTTFT P50\tTTFT P99\tITL P50\tITL P99\tLAT P50\tLAT P99\t"
	if who {
		head = "WHEN\tMODEL\tENGINE\tNODE\tGPUS\t" + head
	}
	fmt.Fprintln(tw, head)
	for _, t := range ts {
		for _, l := range t.Load {
			row := fmt.Sprintf("%d\t%d\t%d\t%.1f\t%.1f\t%.1f ms\t%.1f ms\t%.1f ms\t%.1f ms\t%.1f ms\t%.1f ms\t", l.Concurrency, l.Requests, l.Errors,
				l.RequestsPerSecond, l.OutputTokensPerSecond, l.TTFTP50MS, l.TTFTP99MS, l.ITLP50MS, l.ITLP99MS, l.LatencyP50MS, l.LatencyP99MS)
			if who {
				row = fmt.Sprintf("%s\t%s\t%s\t%s\t%d x %s\t", t.At.Local().Format(time.DateTime), cell(t.Model), cell(t.Engine), cell(t.Node), t.GPUs, cell(t.GPUModel)) + row
			}
			fmt.Fprintln(tw, row)
		}
	}
	tw.Flush()
	for _, t := range ts {
		for _, l := range t.Load {
			if l.FirstError != "" {
				fmt.Fprintf(w, "at %d streams, the first error: %s\n", l.Concurrency, printable(l.FirstError))
			}
		}
	}
}

func newServeTestsCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "tests [NAME]",
		Short: "List kept kiln serve test results, newest first",
		Long: `kiln serve tests lists the results kiln serve test kept, of your projects'
deployments (one name's with NAME), newest first: a row per load level with the
engine, node and GPUs the deployment ran on, to compare them.`,
		Example: `  kiln serve tests
  kiln serve tests llama-3-8b -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			model := ""
			if len(args) == 1 {
				model = args[0]
			}
			ts, err := c.ServeTests(cmd.Context(), model)
			if err != nil {
				return apiErr(err)
			}
			if cf.structured() {
				return writeStructured(cmd.OutOrStdout(), cf.format, api.ServeTestList{Tests: ts})
			}
			if len(ts) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no tests kept")
				return nil
			}
			writeLoadTable(cmd.OutOrStdout(), ts, true)
			return nil
		},
	}
	cf.add(cmd)
	cf.addOutput(cmd)
	return cmd
}

func newServeUsageCmd() *cobra.Command {
	var cf clientFlags
	var days int
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "What the OpenAI-compatible endpoint routed, per project, model and day",
		Long: `kiln serve usage lists, for your projects (every project for an admin), the
requests, errors and tokens the endpoint routed to each deployment name, a row per
day (UTC), newest first. The tokens are what the engines reported in their
answers' usage. The server keeps them; a restart loses at most the last seconds.`,
		Example: `  kiln serve usage
  kiln serve usage --days 7 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := cf.connect()
			if err != nil {
				return err
			}
			rows, err := c.ServeUsage(cmd.Context(), days)
			if err != nil {
				return apiErr(err)
			}
			if cf.structured() {
				return writeStructured(cmd.OutOrStdout(), cf.format, api.ServeUsageList{Usage: rows})
			}
			if len(rows) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "nothing routed")
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "DAY\tPROJECT\tMODEL\tREQUESTS\tERRORS\tPROMPT TOKENS\tCOMPLETION TOKENS")
			for _, r := range rows {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\n", cell(r.Day), cell(r.Project), cell(r.Model),
					r.Usage.Requests, r.Usage.Errors, r.Usage.PromptTokens, r.Usage.CompletionTokens)
			}
			return tw.Flush()
		},
	}
	cf.add(cmd)
	cf.addOutput(cmd)
	cmd.Flags().IntVar(&days, "days", 30, "the last days counted")
	return cmd
}
