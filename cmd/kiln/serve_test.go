package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"kiln.dev/kiln/api"
	"kiln.dev/kiln/compat/imagetest"
	"kiln.dev/kiln/server/tunneltest"
	"kiln.dev/kiln/serving/enginetest"
)

// TestHelperServeEngine is the engine TestServe deploys, not a test.
func TestHelperServeEngine(t *testing.T) {
	if !enginetest.Wanted(flag.Args()) {
		t.Skip("the engine of TestServe")
	}
	t.Fatal(enginetest.Main(flag.Args()[1:]))
}

// tinyModel writes a Hugging Face style folder: a small Llama's
// config.json and a sparse safetensors file.
func tinyModel(t *testing.T, parent string) string {
	t.Helper()
	dir := filepath.Join(parent, "Tiny-Llama-Test")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := `{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":512,"intermediate_size":1376,` +
		`"num_attention_heads":8,"num_key_value_heads":4,"num_hidden_layers":4,"vocab_size":32000,` +
		`"max_position_embeddings":2048,"torch_dtype":"bfloat16"}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(60 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return dir
}

// TestServe deploys a model with kiln serve on kiln up --demo's recorded
// nodes, its engine a real OpenAI-compatible HTTP server (this test
// binary) run as the deployment's job; waits for ready; calls the
// server's OpenAI-compatible endpoint with the member's kiln token as the
// API key (models, a chat completion, a streamed one, a completion,
// embeddings); checks that the tokens are counted in kiln serve ls, that
// another project's member and a caller without a token are refused, that
// an engine that never becomes ready ends with its log and its lease, and
// that kiln serve stop ends the deployment.
func TestServe(t *testing.T) {
	// The lab's registry, the one the nodes pull models from.
	reg := imagetest.NewTestRegistry(t)
	e := setupSecurity(t, "--model-registry", reg.Host)
	dir, engine := jobBinary(t)
	// The model lies where the job sees it (its working directory), as
	// shared storage would.
	model := tinyModel(t, dir)
	ports, err := tunneltest.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	engineCmd := func(mode string) []string {
		return []string{"--workdir", dir, "--", engine, "-test.run=^TestHelperServeEngine$", enginetest.Arg, mode, "{port}", "{name}", "{model}"}
	}

	// The choice, without a lease.
	out, stderr, code := e.kilnAs(e.member, append([]string{"serve", model, "--name", "tiny", "--port", strconv.Itoa(ports[0]), "--dry-run", "-o", "json"}, engineCmd(enginetest.Serve)...)...)
	var choice api.ServeChooseReply
	if code != 0 || json.Unmarshal([]byte(out), &choice) != nil {
		t.Fatalf("kiln serve --dry-run: %d %s\n%s", code, stderr, out)
	}
	if choice.Best.Engine != "custom" || choice.Best.GPUs != 1 || choice.Best.Verdict != "unknown" ||
		!strings.Contains(strings.Join(choice.Best.Command, " "), fmt.Sprintf("serve %d tiny %s", ports[0], model)) {
		t.Errorf("the choice: %+v", choice.Best)
	}
	if leases, _ := e.client(e.member).ListLeases(context.Background(), api.LeaseFilter{}); len(leases) != 0 {
		t.Errorf("--dry-run leased: %+v", leases)
	}

	// The deployment: kiln serve returns once the engine answers ready.
	start := time.Now()
	out, stderr, code = e.kilnAs(e.member, append([]string{"serve", model, "--name", "tiny", "--port", strconv.Itoa(ports[0]), "--wait", "60s"}, engineCmd(enginetest.Serve)...)...)
	if code != 0 || !strings.Contains(out, "tiny is ready") || !strings.Contains(out, "/openai/v1") {
		t.Fatalf("kiln serve: %d\n%s\n%s", code, stderr, out)
	}
	t.Logf("ready in %s: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(out))

	call := func(cfg, method, path, body string) (int, []byte, http.Header) {
		t.Helper()
		token := cfg != ""
		if !token {
			cfg = e.member
		}
		cl := e.client(cfg)
		req, err := http.NewRequest(method, cl.Base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if token {
			req.Header.Set("Authorization", "Bearer "+cl.Token)
		}
		resp, err := cl.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b, resp.Header
	}

	// The models the member may ask for.
	st, body, _ := call(e.member, "GET", "/openai/v1/models", "")
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object, OwnedBy string
		} `json:"data"`
	}
	if st != 200 || json.Unmarshal(body, &models) != nil || models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != "tiny" {
		t.Errorf("GET /openai/v1/models: %d %s", st, body)
	}

	// A chat completion, answered by the engine through the tunnel.
	st, body, chatHdr := call(e.member, "POST", "/openai/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hello there kiln"}]}`)
	var chat struct {
		Object  string `json:"object"`
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Role, Content string
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	want := strings.Join(enginetest.Reply("tiny", "hello there kiln"), " ")
	if c := chatHdr.Get("Set-Cookie"); c != "" || !strings.HasPrefix(chatHdr.Get("Content-Security-Policy"), "sandbox") {
		t.Errorf("the engine's cookie reached the caller (%q), or its answer is not sandboxed (%q)", c, chatHdr.Get("Content-Security-Policy"))
	}
	for _, h := range []string{"Access-Control-Allow-Origin", "Strict-Transport-Security"} {
		if v := chatHdr.Get(h); v != "" {
			t.Errorf("the engine's %s reached the caller: %s", h, v)
		}
	}
	// An engine's redirect is not passed on: the caller's client would
	// follow it with its token.
	if st, body, hdr := call(e.member, "POST", "/openai/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"`+enginetest.RedirectPrompt+`"}]}`); st != 502 || hdr.Get("Location") != "" || !strings.Contains(string(body), "redirect") {
		t.Errorf("an engine's redirect: %d %q %s", st, hdr.Get("Location"), body)
	}
	if st != 200 || json.Unmarshal(body, &chat) != nil || chat.Object != "chat.completion" || len(chat.Choices) != 1 ||
		chat.Choices[0].Message.Content != want || chat.Choices[0].Message.Role != "assistant" || chat.Usage.PromptTokens != 3 {
		t.Errorf("chat completion: %d %s (want the content %q)", st, body, want)
	}

	// A streamed one: server-sent events as the engine sends them, the
	// usage added at the end because the endpoint asked for it.
	st, body, hdr := call(e.member, "POST", "/openai/v1/chat/completions", `{"model":"tiny","stream":true,"messages":[{"role":"user","content":"one two three four"}]}`)
	var streamed strings.Builder
	var sawUsage, sawDone bool
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			sawDone = true
			continue
		}
		var ev struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
			Usage *struct{} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil || ev.Object != "chat.completion.chunk" {
			t.Errorf("a streamed event %q: %v", data, err)
			continue
		}
		for _, c := range ev.Choices {
			streamed.WriteString(c.Delta.Content)
		}
		sawUsage = sawUsage || ev.Usage != nil
	}
	wantStream := strings.Join(enginetest.Reply("tiny", "one two three four"), " ")
	if st != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/event-stream") || streamed.String() != wantStream || !sawDone || !sawUsage {
		t.Errorf("streamed chat: %d %s, content %q (want %q), usage %v, done %v\n%s", st, hdr.Get("Content-Type"), streamed.String(), wantStream, sawUsage, sawDone, body)
	}

	// A completion and embeddings.
	if st, body, _ := call(e.member, "POST", "/openai/v1/completions", `{"model":"tiny","prompt":"a b"}`); st != 200 || !strings.Contains(string(body), `"text":"tiny: b a"`) {
		t.Errorf("completion: %d %s", st, body)
	}
	if st, body, _ := call(e.member, "POST", "/openai/v1/embeddings", `{"model":"tiny","input":"x y"}`); st != 200 || !strings.Contains(string(body), `"embedding":[`) {
		t.Errorf("embeddings: %d %s", st, body)
	}

	// OpenAI's own Go client (generated from OpenAI's published API
	// description) as a user's program calls it: base URL and API key.
	openAICalls(t, e.client(e.member))

	// Victor serves a "tiny" of his own in his project. Mallory's requests
	// still go to hers (his is not hers to see); the admin, who sees both
	// projects, must name one: a name never routes across projects.
	out, stderr, code = e.kilnAs(e.victim, append([]string{"serve", model, "--name", "tiny", "--port", strconv.Itoa(ports[2]), "--wait", "60s"}, engineCmd(enginetest.Serve)...)...)
	if code != 0 {
		t.Fatalf("victor's kiln serve: %d\n%s\n%s", code, stderr, out)
	}
	var mine []string
	for range 4 {
		_, b, _ := call(e.member, "POST", "/openai/v1/completions", `{"model":"tiny","prompt":"whose"}`)
		mine = append(mine, string(b))
	}
	if st, body, _ := call(e.admin, "POST", "/openai/v1/completions", `{"model":"tiny","prompt":"whose"}`); st != 409 || !strings.Contains(string(body), "model_ambiguous") || !strings.Contains(string(body), "default, victims") {
		t.Errorf("the admin asking for tiny served in two projects: %d %s", st, body)
	}
	adminCall := func(project string) int {
		cl := e.client(e.admin)
		req, _ := http.NewRequest("POST", cl.Base+"/openai/v1/completions", strings.NewReader(`{"model":"tiny","prompt":"whose"}`))
		req.Header.Set("Authorization", "Bearer "+cl.Token)
		req.Header.Set("OpenAI-Project", project)
		resp, err := cl.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := adminCall("default"); st != 200 {
		t.Errorf("the admin naming project default: %d", st)
	}
	for _, b := range mine {
		if !strings.Contains(b, `"text":"tiny: whose"`) {
			t.Errorf("mallory's completion: %s", b)
		}
	}
	if _, stderr, code := e.kilnAs(e.victim, "serve", "stop", "tiny"); code != 0 {
		t.Errorf("victor's kiln serve stop: %d %s", code, stderr)
	}
	waitFor(t, "victor's deployment's end", 20*time.Second, func() bool {
		ls, err := e.client(e.victim).ListLeases(context.Background(), api.LeaseFilter{})
		return err == nil && len(ls) == 0
	})

	// Refusals: another project's member gets model_not_found (the model
	// is not theirs to know of); no token, 401; no such model; a body
	// that is not JSON. None reaches the engine.
	if st, body, _ := call(e.victim, "POST", "/openai/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`); st != 404 || !strings.Contains(string(body), "model_not_found") {
		t.Errorf("victor asking for mallory's model: %d %s", st, body)
	}
	if st, body, _ := call(e.victim, "GET", "/openai/v1/models", ""); st != 200 || strings.Contains(string(body), "tiny") {
		t.Errorf("victor's models: %d %s", st, body)
	}
	if st, _, _ := call("", "POST", "/openai/v1/chat/completions", `{"model":"tiny"}`); st != 401 {
		t.Errorf("no token: %d", st)
	}
	if st, body, _ := call(e.member, "POST", "/openai/v1/chat/completions", `{"model":"nope","messages":[]}`); st != 404 || !strings.Contains(string(body), `"error":{`) {
		t.Errorf("an unknown model: %d %s", st, body)
	}
	if st, body, _ := call(e.member, "POST", "/openai/v1/chat/completions", `not json`); st != 400 || !strings.Contains(string(body), "invalid_request_error") {
		t.Errorf("not JSON: %d %s", st, body)
	}

	// kiln serve ls: ready, with the requests and tokens routed.
	out, stderr, code = e.kilnAs(e.member, "serve", "ls", "-o", "json")
	var list api.LeaseList
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Leases) != 1 || list.Leases[0].Deployment == nil {
		t.Fatalf("kiln serve ls: %d %s\n%s", code, stderr, out)
	}
	d := list.Leases[0].Deployment
	// Prompt words: 3 + 4 + 2 + 2 of the calls above, 3 + 4 + 2 + 2 of the
	// SDK's; the chat, stream and completion replies of each.
	replies := len(enginetest.Reply("tiny", "hello there kiln")) + len(enginetest.Reply("tiny", "one two three four")) + len(enginetest.Reply("tiny", "a b")) +
		len(enginetest.Reply("tiny", "sdk says hi")) + len(enginetest.Reply("tiny", "streamed by the sdk")) + len(enginetest.Reply("tiny", "c d"))
	// And five completions of "whose": mallory's four and the admin's.
	replies += 5 * len(enginetest.Reply("tiny", "whose"))
	// The redirect counts as a failed request.
	if d.State != api.DeployReady || d.Usage.Requests != 8+5+1 || d.Usage.Errors != 1 || d.Usage.PromptTokens != 3+4+2+2+3+4+2+2+5 || d.Usage.CompletionTokens != int64(replies) {
		t.Errorf("the deployment: %+v", d)
	}
	// The same, kept per project and day: kiln serve usage.
	out, stderr, code = e.kilnAs(e.member, "serve", "usage", "-o", "json")
	var usage api.ServeUsageList
	if code != 0 || json.Unmarshal([]byte(out), &usage) != nil || len(usage.Usage) != 1 || usage.Usage[0].Project != "default" || usage.Usage[0].Model != "tiny" ||
		usage.Usage[0].Usage != d.Usage {
		t.Errorf("kiln serve usage: %d %s\n%s (the deployment's: %+v)", code, stderr, out, d.Usage)
	}
	if out, _, code := e.kilnAs(e.victim, "serve", "usage", "-o", "json"); code != 0 || strings.Contains(out, `"project": "default"`) {
		t.Errorf("victor sees mallory's usage: %s", out)
	}
	if out, _, _ := e.kilnAs(e.member, "serve", "ls"); !strings.Contains(out, "tiny") || !strings.Contains(out, "ready") {
		t.Errorf("kiln serve ls:\n%s", out)
	}

	// kiln serve test: the smoke checks and a load sweep through the
	// endpoint, kept with the deployment.
	out, stderr, code = e.kilnAs(e.member, "serve", "test", "tiny", "--concurrency", "1,4", "--requests", "8", "--max-tokens", "16", "-o", "json")
	var res api.ServeTest
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("kiln serve test: %d %s\n%s", code, stderr, out)
	}
	if res.ID == "" || res.Model != "tiny" || res.Engine != "custom" || res.Node != choice.Best.Node || res.GPUs != 1 || len(res.Smoke) != 4 || len(res.Load) != 2 {
		t.Errorf("the test kept: %+v", res)
	}
	for _, s := range res.Smoke {
		if !s.OK {
			t.Errorf("smoke check %s failed: %s", s.Name, s.Detail)
		}
	}
	for _, l := range res.Load {
		// The engine answers the 5-word prompt with 6 words a millisecond
		// apart (6 tokens by its usage); chunks may arrive together, so only
		// the slowest gaps show the millisecond.
		if l.Requests != 8 || l.Errors != 0 || l.RequestsPerSecond <= 0 || l.TTFTP50MS <= 0 || l.ITLP99MS < 0.9 || l.LatencyP99MS < l.LatencyP50MS ||
			l.OutputTokensPerSecond < 5.9*l.RequestsPerSecond || l.OutputTokensPerSecond > 6.1*l.RequestsPerSecond {
			t.Errorf("load at %d: %+v", l.Concurrency, l)
		}
	}
	out, _, code = e.kilnAs(e.member, "serve", "tests", "tiny", "-o", "json")
	var kept api.ServeTestList
	if code != 0 || json.Unmarshal([]byte(out), &kept) != nil || len(kept.Tests) != 1 || kept.Tests[0].ID != res.ID {
		t.Errorf("kiln serve tests: %d %s", code, out)
	}
	if out, _, _ := e.kilnAs(e.member, "serve", "tests", "tiny"); !strings.Contains(out, "TTFT P50") || !strings.Contains(out, "custom") {
		t.Errorf("kiln serve tests:\n%s", out)
	} else {
		t.Logf("kiln serve tests tiny:\n%s", out)
	}
	if out, _, _ := e.kilnAs(e.victim, "serve", "tests", "-o", "json"); !strings.Contains(out, `"tests": []`) {
		t.Errorf("victor sees mallory's tests: %s", out)
	}
	if _, err := e.client(e.victim).AddServeTest(context.Background(), list.Leases[0].ID, api.ServeTest{}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("victor keeping a test on mallory's deployment: %v", err)
	}

	// The engine killed: the server starts it again, and the endpoint
	// routes to the new one once it answers ready.
	leaseID, oldJob := list.Leases[0].ID, list.Leases[0].Jobs[0]
	if n := killProcesses(t, engine, enginetest.Serve); n != 1 {
		t.Fatalf("killed %d engine processes, want 1", n)
	}
	killed := time.Now()
	waitFor(t, "the engine started again and routed to", 60*time.Second, func() bool {
		st, _, _ := call(e.member, "POST", "/openai/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"again"}]}`)
		return st == 200
	})
	l, err := e.client(e.member).GetLease(context.Background(), leaseID, api.LeaseWait{})
	if err != nil || l.State != api.LeaseGranted || len(l.Jobs) != 2 || l.Jobs[0] != oldJob || l.Deployment == nil || l.Deployment.State != api.DeployReady {
		t.Errorf("after the kill: %+v, %v", l, err)
	}
	t.Logf("serving again %s after the kill, as job %s", time.Since(killed).Round(time.Millisecond), l.Jobs[len(l.Jobs)-1])
	evs, err := e.client(e.member).Events(context.Background(), api.EventFilter{})
	restarted := false
	for _, ev := range evs {
		restarted = restarted || (ev.Kind == "deployment.restarted" && ev.Subject == leaseID)
	}
	if err != nil || !restarted {
		t.Errorf("no deployment.restarted event for %s: %v", leaseID, err)
	}

	// Another member of the project cannot take the name (the admin is
	// another user of project default).
	if _, stderr, code := e.kilnAs(e.admin, append([]string{"serve", model, "--name", "tiny", "--port", strconv.Itoa(ports[1]), "-p", "default", "-d"}, engineCmd(enginetest.Serve)...)...); code == 0 || !strings.Contains(stderr, "already serves tiny") {
		t.Errorf("the admin taking mallory's name: %d %s", code, stderr)
	}

	// An engine that never answers ready: kiln serve gives up after
	// --wait, prints its last log lines, and ends its lease.
	_, stderr, code = e.kilnAs(e.member, append([]string{"serve", model, "--name", "never", "--port", strconv.Itoa(ports[1]), "--wait", "4s"}, engineCmd(enginetest.NeverReady)...)...)
	if code != 2 || !strings.Contains(stderr, "did not answer ready") || !strings.Contains(stderr, enginetest.LoadingLine) || !strings.Contains(stderr, "ended") {
		t.Errorf("a never-ready engine: %d\n%s", code, stderr)
	}
	waitFor(t, "the never-ready deployment's end", 20*time.Second, func() bool {
		ds, err := e.client(e.member).ListLeases(context.Background(), api.LeaseFilter{})
		if err != nil {
			return false
		}
		for _, l := range ds {
			if l.Request.Serve != nil && l.Request.Serve.Model == "never" {
				return false
			}
		}
		return true
	})

	// A model that fits no GPU is refused before anything is leased.
	if _, stderr, code := e.kilnAs(e.member, append([]string{"serve", model, "--name", "huge", "--port", strconv.Itoa(ports[1]), "--context", "16000000", "--batch", "60000"}, engineCmd(enginetest.Serve)...)...); code != 2 || !strings.Contains(stderr, "does not fit") {
		t.Errorf("a model too big: %d %s", code, stderr)
	}

	// A model that is not there, and one whose config.json is cut short:
	// refused by name, nothing leased.
	bad := filepath.Join(dir, "Bad-Config")
	if err := os.MkdirAll(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(bad, "config.json"), []byte(`{"hidden_size": 512, "num_hidden`), 0o644)
	os.WriteFile(filepath.Join(bad, "model.safetensors"), []byte("x"), 0o644)
	before, _ := e.client(e.member).ListLeases(context.Background(), api.LeaseFilter{All: true})
	for _, m := range []string{filepath.Join(dir, "No-Such-Model"), bad} {
		if _, stderr, code := e.kilnAs(e.member, append([]string{"serve", m, "--port", strconv.Itoa(ports[1])}, engineCmd(enginetest.Serve)...)...); code != 3 || !strings.Contains(stderr, m) {
			t.Errorf("kiln serve %s: %d %s", m, code, stderr)
		}
	}
	if after, _ := e.client(e.member).ListLeases(context.Background(), api.LeaseFilter{All: true}); len(after) != len(before) {
		t.Errorf("bad models leased: %d leases, were %d", len(after), len(before))
	}

	// kiln serve stop: the endpoint stops routing to it.
	if out, stderr, code := e.kilnAs(e.member, "serve", "stop", "tiny"); code != 0 || !strings.Contains(out, "ended") {
		t.Fatalf("kiln serve stop: %d %s %s", code, out, stderr)
	}
	waitFor(t, "the endpoint to stop routing to tiny", 20*time.Second, func() bool {
		st, _, _ := call(e.member, "POST", "/openai/v1/chat/completions", `{"model":"tiny","messages":[{"role":"user","content":"hi"}]}`)
		return st == 404
	})
	if _, stderr, code := e.kilnAs(e.member, "serve", "stop", "tiny"); code != 2 || !strings.Contains(stderr, "no live deployment") {
		t.Errorf("stopping it again: %d %s", code, stderr)
	}

	// Two replicas under one name, on ports one apart: the endpoint takes
	// them in turn; kiln serve stop ends both.
	pair := freePortPair(t)
	out, stderr, code = e.kilnAs(e.member, append([]string{"serve", model, "--name", "duo", "--replicas", "2", "--port", strconv.Itoa(pair), "--wait", "60s"}, engineCmd(enginetest.Serve)...)...)
	if code != 0 || !strings.Contains(out, "2 replicas") {
		t.Fatalf("kiln serve --replicas 2: %d\n%s\n%s", code, stderr, out)
	}
	for range 6 {
		if st, body, _ := call(e.member, "POST", "/openai/v1/chat/completions", `{"model":"duo","messages":[{"role":"user","content":"which one"}]}`); st != 200 {
			t.Fatalf("duo: %d %s", st, body)
		}
	}
	out, _, _ = e.kilnAs(e.member, "serve", "ls", "-o", "json")
	var duo api.LeaseList
	json.Unmarshal([]byte(out), &duo)
	var served []int64
	for _, l := range duo.Leases {
		if l.Request.Serve.Model == "duo" && l.Deployment != nil {
			served = append(served, l.Deployment.Usage.Requests)
		}
	}
	if len(served) != 2 || served[0] != 3 || served[1] != 3 {
		t.Errorf("requests each replica served: %v, want 3 and 3", served)
	}
	if out, stderr, code := e.kilnAs(e.member, "serve", "stop", "duo"); code != 0 || strings.Count(out, "ended") != 2 {
		t.Errorf("kiln serve stop duo: %d %s %s", code, out, stderr)
	}

	// The model from the lab's registry (a real docker-registry): kiln model
	// push, then kiln serve of its reference; the node's agent pulls it into
	// its cache and the engine reads it from there.
	ref := reg.Host + "/models/tiny:v1"
	out, stderr, code = e.kilnAs(e.member, "model", "push", model, ref)
	if code != 0 || !strings.Contains(out, ref+"@sha256:") {
		t.Fatalf("kiln model push: %d %s\n%s", code, stderr, out)
	}
	if out, stderr, code := e.kilnAs(e.member, "model", "ls", reg.Host+"/models/tiny"); code != 0 || !strings.Contains(out, ref) || !strings.Contains(out, "safetensors") {
		t.Errorf("kiln model ls: %d %s\n%s", code, stderr, out)
	}
	out, stderr, code = e.kilnAs(e.member, append([]string{"serve", ref, "--name", "tiny-reg", "--port", strconv.Itoa(ports[1]), "--wait", "60s"}, engineCmd(enginetest.Serve)...)...)
	if code != 0 || !strings.Contains(out, "tiny-reg is ready") {
		t.Fatalf("kiln serve %s: %d\n%s\n%s", ref, code, stderr, out)
	}
	if st, body, _ := call(e.member, "POST", "/openai/v1/chat/completions", `{"model":"tiny-reg","messages":[{"role":"user","content":"from the registry"}]}`); st != 200 || !strings.Contains(string(body), "tiny-reg: registry the from") {
		t.Errorf("the registry model's chat: %d %s", st, body)
	}
	ds, err := e.client(e.member).ListLeases(context.Background(), api.LeaseFilter{})
	var regLease *api.Lease
	for i, l := range ds {
		if l.Request.Serve != nil && l.Request.Serve.Model == "tiny-reg" {
			regLease = &ds[i]
		}
	}
	if err != nil || regLease == nil || regLease.Request.Job.Model == nil || regLease.Request.Serve.Source != ref {
		t.Fatalf("the registry deployment's lease: %+v, %v", regLease, err)
	}
	logs, _, _ := e.kilnAs(e.member, "logs", regLease.Jobs[0])
	if !strings.Contains(logs, "kiln: pulling the model") || !strings.Contains(logs, enginetest.ModelLine+e.models) {
		t.Errorf("the engine did not read the model from the node's cache (%s):\n%s", e.models, logs)
	}
	if _, stderr, code := e.kilnAs(e.member, "serve", "stop", "tiny-reg"); code != 0 {
		t.Errorf("kiln serve stop tiny-reg: %d %s", code, stderr)
	}
	// A registry that does not answer: refused before anything is leased.
	if _, stderr, code := e.kilnAs(e.member, append([]string{"serve", "127.0.0.1:1/models/tiny:v1", "--port", strconv.Itoa(ports[1])}, engineCmd(enginetest.Serve)...)...); code != 3 || !strings.Contains(stderr, "127.0.0.1:1") {
		t.Errorf("an unreachable registry: %d %s", code, stderr)
	}
}

// killProcesses kills (SIGKILL) the processes of bin started in mode, and
// says how many.
func killProcesses(t *testing.T, bin, mode string) int {
	t.Helper()
	procs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) > 3 && args[0] == bin && slices.Contains(args, enginetest.Arg) && slices.Contains(args, mode) {
			if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
				n++
			}
		}
	}
	return n
}

// openAICalls calls the deployment "tiny" with openai-go: the models, a
// chat completion, a streamed one accumulated as the SDK does, a
// completion and embeddings; each answer decoded by the SDK's types.
func openAICalls(t *testing.T, cl *api.Client) {
	t.Helper()
	ctx := context.Background()
	oc := openai.NewClient(option.WithBaseURL(cl.Base+"/openai/v1/"), option.WithAPIKey(cl.Token), option.WithHTTPClient(cl.HTTP), option.WithMaxRetries(0))
	page, err := oc.Models.List(ctx)
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != "tiny" {
		t.Errorf("openai-go Models.List: %+v, %v", page, err)
	}
	chat, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("sdk says hi")}})
	if err != nil || len(chat.Choices) != 1 || chat.Choices[0].Message.Content != strings.Join(enginetest.Reply("tiny", "sdk says hi"), " ") || chat.Usage.PromptTokens != 3 {
		t.Errorf("openai-go chat completion: %+v, %v", chat, err)
	}
	stream := oc.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "tiny",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("streamed by the sdk")}})
	acc := openai.ChatCompletionAccumulator{}
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil || chunks < 4 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content != strings.Join(enginetest.Reply("tiny", "streamed by the sdk"), " ") {
		t.Errorf("openai-go streamed chat: %d chunks, %+v, %v", chunks, acc.Choices, err)
	}
	cmpl, err := oc.Completions.New(ctx, openai.CompletionNewParams{Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("c d")}})
	if err != nil || len(cmpl.Choices) != 1 || cmpl.Choices[0].Text != "tiny: d c" {
		t.Errorf("openai-go completion: %+v, %v", cmpl, err)
	}
	emb, err := oc.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "tiny", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("e f")}})
	if err != nil || len(emb.Data) != 1 || len(emb.Data[0].Embedding) != 8 {
		t.Errorf("openai-go embeddings: %+v, %v", emb, err)
	}
	// An unknown model is an error the SDK reads as OpenAI's.
	_, err = oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "nope", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Errorf("openai-go, an unknown model: %v", err)
	}
}

// freePortPair is a port p such that p and p+1 are free on loopback now.
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 50 {
		ps, err := tunneltest.FreePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ps[0]+1))
		if err == nil {
			ln.Close()
			return ps[0]
		}
	}
	t.Fatal("no two free ports in a row")
	return 0
}
