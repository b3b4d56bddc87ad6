//go:build agentonly

// Built with -tags agentonly (scripts/install.sh writes it as kiln-agent),
// kiln holds only what a GPU node's agent runs: kiln agent and kiln join.
// The server, the analysis commands and their libraries (the image reader,
// SQLite, the planner's plots) stay out, so the agent's process maps less
// and stays small (bench/agent measures both binaries).

package main

// rootLong is the agent-only binary's help text.
const rootLong = `kiln-agent is kiln built for GPU nodes: it holds only 'kiln agent' and
'kiln join', so the agent's process stays small. Every other command is in the
full kiln binary; both speak to the same server.

Start with:
  kiln-agent join https://SERVER:7443 --token TOKEN --ca-sha256 FINGERPRINT
  kiln-agent agent --metrics-addr :9402`
