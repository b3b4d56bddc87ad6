package api

import "time"

// ServeSpec marks a lease as a model deployment: its job is an inference
// engine serving Model on Port. The server's OpenAI-compatible endpoint
// routes requests that ask for Model to it once Ready answers 200 there.
type ServeSpec struct {
	// Model is the name clients ask for in a request's model field; the
	// leases of one user in one project that serve the same name are
	// replicas of one deployment.
	Model  string `json:"model"`
	Engine string `json:"engine,omitempty"`
	// Port is one of the job's declared ports.
	Port int `json:"port"`
	// Ready is the engine's readiness path, "/health".
	Ready string `json:"ready"`
	// Source is where the model was read from (its folder or file).
	Source string `json:"source,omitempty"`
}

// States of a deployment.
const (
	DeployStarting = "starting" // its engine has not answered ready yet
	DeployReady    = "ready"    // requests are routed to it
	DeployUnready  = "unready"  // it was ready and its readiness check fails now
)

// Deployment is what the server knows of a serving lease now; it is not
// stored, and starts again as starting when the server restarts.
type Deployment struct {
	State string    `json:"state"`
	Since time.Time `json:"since"`
	// Reason is the last readiness check's failure.
	Reason string     `json:"reason,omitempty"`
	Usage  ServeUsage `json:"usage"`
}

// ServeUsage counts what the endpoint routed to a deployment, as its
// engine reported the tokens.
type ServeUsage struct {
	Requests         int64 `json:"requests"`
	Errors           int64 `json:"errors"`
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// ServeModel is what kiln read of a model to serve (kiln serve reads the
// folder or file where it is, and sends this).
type ServeModel struct {
	Name string `json:"name"`
	// Format is safetensors or gguf.
	Format string `json:"format"`
	// Precision is the weights' (bf16, fp16, fp32, fp8); "" is bf16.
	Precision    string `json:"precision,omitempty"`
	WeightsBytes int64  `json:"weights_bytes"`
	// Path is where the model lies, as the nodes see it (shared storage):
	// its folder, or its GGUF file; File is its one weights file (GGUF).
	Path string `json:"path,omitempty"`
	File string `json:"file,omitempty"`
	// Ref is a model of the lab's registry instead (kiln model push),
	// pinned: REGISTRY/REPOSITORY@sha256:...; File is then its weights
	// file's path inside the model.
	Ref string `json:"ref,omitempty"`
	// Shape is the model's, from its config.json or GGUF header; a GGUF
	// file may have none.
	Shape *ModelShape `json:"shape,omitempty"`
}

// ModelShape is a transformer's shape, as kiln plan sizes it.
type ModelShape struct {
	Layers          int     `json:"layers"`
	EncoderLayers   int     `json:"encoder_layers,omitempty"`
	Hidden          int     `json:"hidden"`
	Heads           int     `json:"heads"`
	KVHeads         int     `json:"kv_heads,omitempty"`
	HeadDim         int     `json:"head_dim,omitempty"`
	FFN             int     `json:"ffn"`
	Gated           bool    `json:"gated,omitempty"`
	Tied            bool    `json:"tied,omitempty"`
	Vocab           int     `json:"vocab"`
	Seq             int     `json:"seq"`
	MaxSeq          int     `json:"max_seq,omitempty"`
	Experts         int     `json:"experts,omitempty"`
	ExpertsPerToken int     `json:"experts_per_token,omitempty"`
	Params          float64 `json:"params,omitempty"`
}

// ServeChooseRequest asks the server how it would serve a model: the
// engine, image, node and GPUs, chosen from its nodes and what kiln compat
// read of images. Zero values are chosen.
type ServeChooseRequest struct {
	Model ServeModel `json:"model"`
	// Engine names a catalogue engine; Image or Command give the user's
	// own (with Port and Ready); Process runs the catalogue engine's
	// command on the node instead of its image.
	Engine  string   `json:"engine,omitempty"`
	Image   string   `json:"image,omitempty"`
	Command []string `json:"command,omitempty"`
	Port    int      `json:"port,omitempty"`
	Ready   string   `json:"ready,omitempty"`
	Process bool     `json:"process,omitempty"`
	Context int      `json:"context,omitempty"`
	Batch   int      `json:"batch,omitempty"`
	GPUs    int      `json:"gpus,omitempty"`
}

// ServeChoice is one way to serve the model.
type ServeChoice struct {
	Engine string `json:"engine"`
	// Image is "" for an engine run as a process on the node.
	Image string `json:"image,omitempty"`
	Node  string `json:"node"`
	// GPUs is the tensor-parallel degree, Island the node's GPU indexes
	// that hold it, Link what joins them.
	GPUs   int    `json:"gpus"`
	Island []int  `json:"island"`
	Link   string `json:"link"`
	// Verdict is kiln compat's for the image there (runs, unknown, ...);
	// VerdictFrom whether it read the image.
	Verdict           string  `json:"verdict"`
	VerdictFrom       string  `json:"verdict_from"`
	MemoryPerGPUBytes float64 `json:"memory_per_gpu_bytes"`
	CapacityBytes     float64 `json:"capacity_bytes"`
	Context           int     `json:"context"`
	Batch             int     `json:"batch"`
	// Command is the engine's command line, filled for this choice.
	Command []string `json:"command"`
	Port    int      `json:"port"`
	Ready   string   `json:"ready"`
	Notes   []string `json:"notes,omitempty"`
}

// ServeChooseReply is the best choice, the others that would also serve,
// and why the rest were left out.
type ServeChooseReply struct {
	Best    ServeChoice   `json:"best"`
	Others  []ServeChoice `json:"others,omitempty"`
	Skipped []string      `json:"skipped,omitempty"`
}

// ServeTest is what kiln serve test measured of a deployment: its smoke
// checks and a load test per concurrency. The server fills in where the
// deployment ran (engine, image, node, GPUs) and who ran the test, so that
// one model can be compared across nodes, GPUs and engines.
type ServeTest struct {
	ID       string    `json:"id"`
	LeaseID  string    `json:"lease_id"`
	Project  string    `json:"project"`
	User     string    `json:"user"`
	Model    string    `json:"model"`
	Engine   string    `json:"engine"`
	Image    string    `json:"image,omitempty"`
	Node     string    `json:"node"`
	GPUs     int       `json:"gpus"`
	GPUModel string    `json:"gpu_model,omitempty"`
	At       time.Time `json:"at"`
	// Smoke are the checks that one request of each kind works.
	Smoke []ServeSmoke `json:"smoke"`
	// Load is the concurrency sweep, one level each.
	Load []ServeLoad `json:"load"`
}

// ServeSmoke is one smoke check: a completion, a chat turn, a stream.
type ServeSmoke struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// ServeLoad is a load test at one concurrency: streamed chat completions,
// Concurrency at once, Requests in all. Times are in milliseconds; TTFT is
// the time to the first token, ITL the time between tokens.
type ServeLoad struct {
	Concurrency           int     `json:"concurrency"`
	Requests              int     `json:"requests"`
	Errors                int     `json:"errors"`
	Seconds               float64 `json:"seconds"`
	RequestsPerSecond     float64 `json:"requests_per_s"`
	OutputTokensPerSecond float64 `json:"output_tokens_per_s"`
	TTFTP50MS             float64 `json:"ttft_p50_ms"`
	TTFTP99MS             float64 `json:"ttft_p99_ms"`
	ITLP50MS              float64 `json:"itl_p50_ms"`
	ITLP99MS              float64 `json:"itl_p99_ms"`
	LatencyP50MS          float64 `json:"latency_p50_ms"`
	LatencyP99MS          float64 `json:"latency_p99_ms"`
	// FirstError is the first failed request's error.
	FirstError string `json:"first_error,omitempty"`
}

// ServeTestList is stored test results, newest first.
type ServeTestList struct {
	Tests []ServeTest `json:"tests"`
}

// ServeUsageRow is what the endpoint routed for one project's model on one
// day (UTC), kept by the server.
type ServeUsageRow struct {
	Project string     `json:"project"`
	Model   string     `json:"model"`
	Day     string     `json:"day"`
	Usage   ServeUsage `json:"usage"`
}

// ServeUsageList is kept usage, newest day first.
type ServeUsageList struct {
	Usage []ServeUsageRow `json:"usage"`
}
