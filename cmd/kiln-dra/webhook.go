package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"
	admissionregv1 "k8s.io/api/admissionregistration/v1"

	"kiln.dev/kiln/admission/webhook"
	"kiln.dev/kiln/compat/image"
)

func init() { addCommand(newWebhookCmd) }

func newWebhookCmd() *cobra.Command {
	var kubeconfig, listen, certFile, keyFile string
	var insecureRegistries bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "webhook --cert FILE --key FILE [--listen :8443]",
		Short: "Serve the admission webhook: refuse Pods whose images run on no GPU, keep claims on the GPUs that run them",
		Long: `kiln-dra webhook is an admission webhook for the apiserver (over TLS).

On Pod creation (` + webhook.PathPods + `, a ValidatingWebhookConfiguration), a Pod
with resource claims has its images read from their registries, with the Pod's
pull secrets only, and checked by kiln compat against every gpu.kiln.dev device
the cluster publishes: a Pod whose image runs on none is refused with kiln's
reason and fix. An image that runs on part of the fleet, or that kiln cannot
read within --timeout or cannot judge, is allowed with a warning.

On ResourceClaim creation (` + webhook.PathClaims + `, a MutatingWebhookConfiguration),
a claim made for a Pod (from its claim template) that asks for kiln's devices
gets a CEL selector that lets the scheduler choose only devices that run the
Pod's images (least cudaDriverVersion, compute capabilities, gfx targets).

Pods in kube-system, kube-public and kube-node-lease are never checked.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if certFile == "" || keyFile == "" {
				return &exitError{code: 3, err: errors.New("give the serving certificate with --cert and --key (the apiserver only calls webhooks over TLS)")}
			}
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return &exitError{code: 3, err: fmt.Errorf("serving certificate: %w", err)}
			}
			client, err := kubeClient(kubeconfig)
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			h := webhook.Handler(webhook.Config{
				Images:  &webhook.Registry{Insecure: insecureRegistries, Cache: image.NewCache(image.DefaultCacheDir())},
				Cluster: webhook.KubeCluster{Client: client},
				Timeout: timeout,
				Log:     slog.Default(),
			})
			return serveTLS(cmd.Context(), listen, cert, h)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: the pod's service account)")
	fl.StringVar(&listen, "listen", ":8443", "address to serve on")
	fl.StringVar(&certFile, "cert", "", "serving certificate (PEM), its name the webhook Service's DNS name")
	fl.StringVar(&keyFile, "key", "", "the certificate's private key (PEM)")
	fl.BoolVar(&insecureRegistries, "insecure-registries", false, "allow plain-HTTP registries (an air-gapped lab's)")
	fl.DurationVar(&timeout, "timeout", 8*time.Second, "how long to read a Pod's images before allowing it with a warning (keep it under the webhook's timeoutSeconds)")
	cmd.AddCommand(newWebhookManifestsCmd())
	return cmd
}

func newWebhookManifestsCmd() *cobra.Command {
	var o webhook.ManifestOptions
	var policy string
	cmd := &cobra.Command{
		Use:   "manifests [--namespace kiln-system] [--image REF] [--failure-policy Fail|Ignore]",
		Short: "Print the objects that install the webhook, with a certificate made for it",
		Long: `kiln-dra webhook manifests prints, as YAML, what installs the admission webhook:
a serving certificate for its Service signed by a CA made on the spot (the CA's
key is not kept, so nothing else can be signed with it), the Secret holding
it, the ServiceAccount and ClusterRole (read ResourceSlices, Pods and the pull
secrets Pods name), the Deployment and Service, and the Validating and
Mutating webhook configurations with the CA bundle. The output holds a private
key: apply it directly,

  kiln-dra webhook manifests | kubectl apply -f -

and run it again to renew the certificate.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.FailurePolicy = admissionregv1.FailurePolicyType(policy)
			objs, err := webhook.Manifests(o)
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			return writeList(cmd.OutOrStdout(), "yaml", objs)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Namespace, "namespace", "kiln-system", "namespace of the webhook")
	fl.StringVar(&o.Name, "name", "kiln-webhook", "name of its Deployment, Service and configurations")
	fl.StringVar(&o.Image, "image", "kiln.dev/kiln:latest", "image with kiln-dra (a local registry's, in an air-gapped lab)")
	fl.StringVar(&policy, "failure-policy", "Fail", "what the apiserver does while the webhook is down: Fail (refuse Pods with claims) or Ignore (let them through)")
	fl.BoolVar(&o.InsecureRegistries, "insecure-registries", false, "let the webhook read plain-HTTP registries")
	return cmd
}

// serveTLS serves h until ctx ends.
func serveTLS(ctx context.Context, addr string, cert tls.Certificate, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return &exitError{code: 3, err: err}
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	slog.Info("kiln-dra webhook serving", "addr", ln.Addr().String())
	if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
