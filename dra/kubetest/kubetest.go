// Package kubetest runs a real Kubernetes control plane on loopback for
// kiln's DRA tests and benchmark: etcd, kube-apiserver, kube-scheduler and
// (when asked) kube-controller-manager, from the binaries scripts/kube.sh
// builds. There is no kubelet: pods are bound by the real scheduler and stay
// Pending on their node.
package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// EnvBin names the folder with the binaries (scripts/kube.sh prints it).
const EnvBin = "KILN_KUBE_BIN"

// Binaries are the programs a control plane needs.
var Binaries = []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"}

// BinDir returns the folder of the control-plane binaries, or an error
// that says how to build them.
func BinDir() (string, error) {
	dir := os.Getenv(EnvBin)
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "kiln", "kube", "v1.37.2", "bin")
	}
	for _, b := range Binaries {
		if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.IsDir() {
			return "", fmt.Errorf("no %s in %s: run scripts/kube.sh and set %s to the folder it prints", b, dir, EnvBin)
		}
	}
	return dir, nil
}

// Options choose what runs.
type Options struct {
	// ControllerManager starts kube-controller-manager with the
	// resourceclaim controller (claims made from ResourceClaimTemplates).
	ControllerManager bool
	// SchedulerQPS raises the scheduler's client limits (benchmarks).
	SchedulerQPS int
	// NoScheduler starts etcd and the apiserver only.
	NoScheduler bool
	// FeatureGates is passed to the apiserver and the scheduler
	// ("DRAConsumableCapacity=false").
	FeatureGates string
	// Log receives the components' output; nil discards it.
	Log io.Writer
}

// ControlPlane is a running control plane.
type ControlPlane struct {
	Dir        string
	Kubeconfig string
	Config     *rest.Config
	Client     kubernetes.Interface
	procs      []*exec.Cmd
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start runs a control plane in dir (a fresh folder) until Stop.
func Start(ctx context.Context, dir string, o Options) (cp *ControlPlane, err error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	cp = &ControlPlane{Dir: dir}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	out := o.Log
	if out == nil {
		out = io.Discard
	}
	etcdPort, err := freePort()
	if err != nil {
		return nil, err
	}
	apiPort, err := freePort()
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	if err := cp.run(ctx, out, filepath.Join(bin, "etcd"),
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls=http://127.0.0.1:0", "--unsafe-no-fsync=true", "--log-level=error"); err != nil {
		return nil, err
	}

	tokenBytes := make([]byte, 16)
	if _, err := rand.Read(tokenBytes); err != nil {
		return nil, err
	}
	token := hex.EncodeToString(tokenBytes)
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return nil, err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	keyFile := filepath.Join(dir, "sa.key")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return nil, err
	}
	var gates []string
	if o.FeatureGates != "" {
		gates = []string{"--feature-gates=" + o.FeatureGates}
	}
	if err := cp.run(ctx, out, filepath.Join(bin, "kube-apiserver"), append([]string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(apiPort), "--cert-dir=" + filepath.Join(dir, "certs"),
		"--token-auth-file=" + tokens, "--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file=" + keyFile,
		"--service-account-signing-key-file=" + keyFile, "--service-cluster-ip-range=10.0.0.0/24",
		"--endpoint-reconciler-type=none", "--allow-privileged=true",
		"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
		"--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000"}, gates...)...); err != nil {
		return nil, err
	}
	host := "https://127.0.0.1:" + strconv.Itoa(apiPort)
	cp.Config = &rest.Config{Host: host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 500, Burst: 1000}
	cp.Kubeconfig = filepath.Join(dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: %q}
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
`, host, token)
	if err := os.WriteFile(cp.Kubeconfig, []byte(kc), 0o600); err != nil {
		return nil, err
	}
	if err := waitReady(ctx, host, token); err != nil {
		return nil, err
	}
	if cp.Client, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return nil, err
	}
	if o.NoScheduler {
		return cp, nil
	}
	schedArgs := append([]string{"--kubeconfig=" + cp.Kubeconfig, "--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false"}, gates...)
	if o.SchedulerQPS > 0 {
		schedArgs = append(schedArgs, "--kube-api-qps="+strconv.Itoa(o.SchedulerQPS), "--kube-api-burst="+strconv.Itoa(2*o.SchedulerQPS))
	}
	if err := cp.run(ctx, out, filepath.Join(bin, "kube-scheduler"), schedArgs...); err != nil {
		return nil, err
	}
	if o.ControllerManager {
		if err := cp.run(ctx, out, filepath.Join(bin, "kube-controller-manager"),
			"--kubeconfig="+cp.Kubeconfig, "--controllers=resourceclaim-controller",
			"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
			"--use-service-account-credentials=false"); err != nil {
			return nil, err
		}
	}
	return cp, nil
}

func (cp *ControlPlane) run(ctx context.Context, out io.Writer, bin string, args ...string) error {
	c := exec.Command(bin, args...)
	c.Stdout, c.Stderr = out, out
	// The components die with the process that started them, even when it
	// is killed before it can stop them.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", filepath.Base(bin), err)
	}
	cp.procs = append(cp.procs, c)
	return nil
}

// waitReady polls the apiserver's /readyz.
func waitReady(ctx context.Context, host, token string) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("readyz %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("the apiserver did not get ready: %w", last)
}

// Stop ends every component, newest first, and waits for each to exit.
func (cp *ControlPlane) Stop() {
	for i := len(cp.procs) - 1; i >= 0; i-- {
		p := cp.procs[i]
		if p.Process == nil {
			continue
		}
		_ = p.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- p.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
	cp.procs = nil
}
