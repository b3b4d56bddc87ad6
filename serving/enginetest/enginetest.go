// Package enginetest is an inference engine for tests of kiln serve: a
// real HTTP server that speaks the parts of OpenAI's API that engines such
// as vLLM and llama.cpp's server serve (models, completions, chat
// completions with and without streaming, embeddings, a readiness path),
// answering with words made from the prompt instead of a model's. A test
// binary started as a deployment's job runs it.
package enginetest

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Arg is the first argument a test binary started as the engine gets,
// after its -test.run flag: ARG MODE PORT NAME MODEL.
const Arg = "kiln-test-engine"

// Modes of the engine.
const (
	// Serve becomes ready after LoadTime and serves.
	Serve = "serve"
	// NeverReady listens and answers 503 on /health for ever, as an
	// engine whose weights never load.
	NeverReady = "never-ready"
)

// LoadTime is how long the engine takes to "load" before /health answers
// 200 (503 until then, as vLLM answers while it loads).
const LoadTime = 500 * time.Millisecond

// ModelLine is what the engine prints once it has read the model's
// config.json.
const ModelLine = "enginetest: read the model at "

// LoadingLine is what the engine prints while it loads, and the never-ready
// engine prints for ever.
const LoadingLine = "enginetest: loading weights from "

// Reply is the words the engine answers a prompt with, one per
// streamed event: the model's name, then the prompt's words reversed.
func Reply(model, prompt string) []string {
	words := strings.Fields(prompt)
	out := []string{model + ":"}
	for i := len(words) - 1; i >= 0; i-- {
		out = append(out, words[i])
	}
	return out
}

// Main runs the engine from args (MODE PORT NAME MODEL) until the process
// is stopped.
func Main(args []string) error {
	if len(args) != 4 {
		return fmt.Errorf("enginetest: want MODE PORT NAME MODEL, got %q", args)
	}
	mode, name, model := args[0], args[2], args[3]
	port, err := strconv.Atoi(args[1])
	if err != nil {
		return fmt.Errorf("enginetest: port %q: %w", args[1], err)
	}
	// As an engine does, read the model: the job must see it.
	if _, err := os.Stat(model); err != nil {
		return fmt.Errorf("enginetest: the model: %w", err)
	}
	if b, err := os.ReadFile(filepath.Join(model, "config.json")); err == nil {
		fmt.Printf("%s%s: config.json of %d bytes\n", ModelLine, model, len(b))
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return err
	}
	fmt.Printf("%s%s\n", LoadingLine, model)
	e := &engine{name: name, started: time.Now(), neverReady: mode == NeverReady}
	if mode == NeverReady {
		go func() {
			for range time.Tick(200 * time.Millisecond) {
				fmt.Printf("%s%s\n", LoadingLine, model)
			}
		}()
	} else if mode != Serve {
		return fmt.Errorf("enginetest: mode %q", mode)
	}
	return http.Serve(ln, e.handler())
}

type engine struct {
	name       string
	started    time.Time
	neverReady bool
	requests   atomic.Int64
}

func (e *engine) ready() bool { return !e.neverReady && time.Since(e.started) >= LoadTime }

func (e *engine) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if !e.ready() {
			http.Error(w, "loading", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"object": "list", "data": []any{map[string]any{"id": e.name, "object": "model", "created": e.started.Unix(), "owned_by": "enginetest"}}})
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model    string `json:"model"`
			Messages []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
			Stream        bool `json:"stream"`
			StreamOptions *struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if !e.decode(w, r, &req) {
			return
		}
		if len(req.Messages) == 0 {
			openAIError(w, http.StatusBadRequest, "messages is empty")
			return
		}
		prompt := req.Messages[len(req.Messages)-1].Content
		if prompt == RedirectPrompt {
			// Sends the caller, with its credentials, elsewhere on the
			// server's origin.
			http.Redirect(w, r, "/v1/tokens", http.StatusTemporaryRedirect)
			return
		}
		e.answer(w, "chat.completion", req.Model, prompt, req.Stream, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model         string `json:"model"`
			Prompt        string `json:"prompt"`
			Stream        bool   `json:"stream"`
			StreamOptions *struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if !e.decode(w, r, &req) {
			return
		}
		e.answer(w, "text_completion", req.Model, req.Prompt, req.Stream, req.StreamOptions != nil && req.StreamOptions.IncludeUsage)
	})
	mux.HandleFunc("POST /v1/embeddings", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Model string `json:"model"`
			Input string `json:"input"`
		}
		if !e.decode(w, r, &req) {
			return
		}
		sum := sha256.Sum256([]byte(req.Input))
		vec := make([]float64, 8)
		for i := range vec {
			vec[i] = float64(binary.BigEndian.Uint32(sum[i*4:]))/float64(1<<32) - 0.5
		}
		n := len(strings.Fields(req.Input))
		writeJSON(w, map[string]any{"object": "list", "model": req.Model,
			"data":  []any{map[string]any{"object": "embedding", "index": 0, "embedding": vec}},
			"usage": map[string]any{"prompt_tokens": n, "total_tokens": n}})
	})
	// The engine is a tenant's process: the caller's kiln token must
	// never reach it.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" || strings.Contains(r.Header.Get("Cookie"), "kiln") {
			openAIError(w, http.StatusBadRequest, CredentialsSeen)
			return
		}
		// A tenant's engine trying to set a cookie on the server's origin
		// (kiln's session cookie, say); the endpoint must not pass it.
		w.Header().Set("Set-Cookie", "kiln_session=planted; Path=/")
		w.Header().Set("Access-Control-Allow-Origin", "*")
		w.Header().Set("Strict-Transport-Security", "max-age=0")
		mux.ServeHTTP(w, r)
	})
}

// RedirectPrompt is a chat prompt the engine answers with a redirect to
// the server's tokens.
const RedirectPrompt = "redirect me"

// CredentialsSeen is the engine's answer to a request that carries kiln's
// credentials.
const CredentialsSeen = "enginetest: the caller's credentials reached the engine"

func (e *engine) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if !e.ready() {
		openAIError(w, http.StatusServiceUnavailable, "the model is loading")
		return false
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(v); err != nil {
		openAIError(w, http.StatusBadRequest, err.Error())
		return false
	}
	e.requests.Add(1)
	return true
}

// answer writes a completion or chat completion, whole or as server-sent
// events, with the usage OpenAI's API reports (in the stream's last event
// when asked).
func (e *engine) answer(w http.ResponseWriter, object, model, prompt string, stream, usage bool) {
	if model != e.name {
		openAIError(w, http.StatusNotFound, fmt.Sprintf("the model %q does not exist (this engine serves %s)", model, e.name))
		return
	}
	words := Reply(model, prompt)
	id := fmt.Sprintf("cmpl-%d", e.requests.Load())
	u := map[string]any{"prompt_tokens": len(strings.Fields(prompt)), "completion_tokens": len(words), "total_tokens": len(strings.Fields(prompt)) + len(words)}
	choice := func(text string, final bool) map[string]any {
		c := map[string]any{"index": 0, "finish_reason": nil}
		if final {
			c["finish_reason"] = "stop"
		}
		switch {
		case object == "text_completion":
			c["text"] = text
		case stream:
			c["delta"] = map[string]any{"role": "assistant", "content": text}
		default:
			c["message"] = map[string]any{"role": "assistant", "content": text}
		}
		return c
	}
	if !stream {
		writeJSON(w, map[string]any{"id": id, "object": object, "created": time.Now().Unix(), "model": model,
			"choices": []any{choice(strings.Join(words, " "), true)}, "usage": u})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl, _ := w.(http.Flusher)
	chunk := object
	if object == "chat.completion" {
		chunk = "chat.completion.chunk"
	}
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		if fl != nil {
			fl.Flush()
		}
	}
	for i, word := range words {
		text := word
		if i > 0 {
			text = " " + word
		}
		send(map[string]any{"id": id, "object": chunk, "created": time.Now().Unix(), "model": model,
			"choices": []any{choice(text, i == len(words)-1)}})
		time.Sleep(time.Millisecond)
	}
	if usage {
		send(map[string]any{"id": id, "object": chunk, "created": time.Now().Unix(), "model": model, "choices": []any{}, "usage": u})
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	if fl != nil {
		fl.Flush()
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func openAIError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "param": nil, "code": nil}})
}

// Wanted reports whether args (a test binary's flag.Args) start the engine.
func Wanted(args []string) bool { return len(args) > 0 && args[0] == Arg }
